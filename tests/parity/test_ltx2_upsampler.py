"""LTX2LatentUpsampler against diffusers' LTX2LatentUpsamplerModel, and our latent path against
LTX2LatentUpsamplePipeline (output_type="latent")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel
from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline
from diffusers.pipelines.ltx2.pipeline_ltx2_latent_upsample import LTX2LatentUpsamplePipeline

from tests.helpers.ltx2_vae_fixtures import (
    UPSAMPLER_A,
    UPSAMPLER_B,
    UPSAMPLER_CONFIGS,
    VAE_A,
    VAE_B,
    TinyUpsampler,
    TinyVideoVAE,
    write_upsampler,
    write_video_vae,
)
from vidloom.core.errors import CheckpointError, InvalidRequest
from vidloom.models.ltx2.checkpoint import load_latent_upsampler, load_video_vae
from vidloom.models.ltx2.upsampler import (
    LTX2_UPSAMPLER_NAME_MAP,
    LatentUpsampleParams,
    LTX2LatentUpsampler,
    upsample_latents,
)
from vidloom.models.ltx2.video_vae import LTX2VideoVAE

# fp32 CPU, same ops; the AdaIN statistics are reduced in one call here and per channel in diffusers,
# which reorders float sums (~1e-7 relative).
ATOL = 1e-5


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


@pytest.fixture(scope="module", params=UPSAMPLER_CONFIGS, ids=lambda s: s.name)
def upsampler_pair(request, tmp_path_factory) -> tuple[LTX2LatentUpsampler, LTX2LatentUpsamplerModel]:
    spec: TinyUpsampler = request.param
    folder = tmp_path_factory.mktemp(spec.name)
    ref = write_upsampler(folder, spec)
    return load_latent_upsampler(folder), ref


def test_upsampler_name_map_covers_the_checkpoint(upsampler_pair) -> None:
    ours, ref = upsampler_pair
    module_keys = [LTX2_UPSAMPLER_NAME_MAP.to_module(k) for k in ref.state_dict()]
    assert sorted(module_keys) == sorted(ours.state_dict())


def test_upsampler_matches_diffusers(upsampler_pair) -> None:
    ours, ref = upsampler_pair
    latents = torch.randn(2, ours.config.in_channels, 3, 4, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(latents)
        got = ours(latents)
    frames = 5 if ours.config.temporal_upsample else 3
    scale = ours.config.spatial_scale
    assert got.shape == (2, ours.config.in_channels, frames, int(4 * scale), int(6 * scale))
    assert _max_diff(got, expected) <= ATOL
    assert expected.std() > 0.05


def test_upsampler_refuses_other_latent_widths(upsampler_pair) -> None:
    ours, _ = upsampler_pair
    with pytest.raises(InvalidRequest, match=rf"latents: expected \[batch, {ours.config.in_channels}, "):
        ours(torch.zeros(1, ours.config.in_channels + 1, 1, 2, 2))


# -- the pipeline's latent path ---------------------------------------------------------------------


@dataclass
class Stack:
    spec: TinyVideoVAE
    vae: LTX2VideoVAE
    upsampler: LTX2LatentUpsampler
    pipe: LTX2LatentUpsamplePipeline


@pytest.fixture(scope="module", params=[(VAE_A, UPSAMPLER_A), (VAE_B, UPSAMPLER_B)], ids=["a", "b"])
def stack(request, tmp_path_factory) -> Stack:
    vae_spec: TinyVideoVAE
    up_spec: TinyUpsampler
    vae_spec, up_spec = request.param
    root = tmp_path_factory.mktemp(f"{vae_spec.name}-{up_spec.name}")
    ref_vae = write_video_vae(root / "vae", vae_spec)
    ref_up = write_upsampler(root / "latent_upsampler", up_spec)
    pipe = LTX2LatentUpsamplePipeline(vae=ref_vae, latent_upsampler=ref_up)
    pipe.set_progress_bar_config(disable=True)
    return Stack(vae_spec, load_video_vae(root / "vae"), load_latent_upsampler(root / "latent_upsampler"), pipe)


@pytest.mark.parametrize("normalized", [True, False], ids=["normalized", "raw"])
@pytest.mark.parametrize(("adain", "tone"), [(0.0, 0.0), (1.0, 0.0), (0.5, 0.6)], ids=["plain", "adain", "both"])
def test_latent_path_matches_the_upsample_pipeline(stack: Stack, normalized: bool, adain: float, tone: float) -> None:
    latents = torch.randn(2, stack.vae.config.latent_channels, 2, 3, 4, generator=torch.Generator().manual_seed(1))
    expected = stack.pipe(latents=latents, latents_normalized=normalized, adain_factor=adain,
                          tone_map_compression_ratio=tone, output_type="latent", return_dict=False)[0]
    params = LatentUpsampleParams(adain_factor=adain, tone_map_compression_ratio=tone)
    got = upsample_latents(stack.upsampler, stack.vae, latents, params, normalized=normalized, renormalize=False)
    assert _max_diff(got, expected) <= ATOL
    # What the refinement pass receives: LTX2Pipeline normalises the latents it is handed.
    vae = stack.pipe.vae
    handed = LTX2Pipeline._normalize_latents(expected, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    renormalized = upsample_latents(stack.upsampler, stack.vae, latents, params, normalized=normalized)
    assert _max_diff(renormalized, handed) <= ATOL


def test_video_path_matches_the_upsample_pipeline(stack: Stack) -> None:
    # The pipeline's video input: frames in [0, 1] (already at the target size, so its resize is the
    # identity), encoded with a posterior sample from the generator, then upsampled.
    _, _, frames, height, width = stack.spec.video_shape
    clip = np.random.default_rng(0).random((frames, height, width, 3)).astype(np.float32)
    expected = stack.pipe(video=list(clip), height=height, width=width, generator=torch.Generator().manual_seed(7),
                          output_type="latent", return_dict=False)[0]
    video = torch.from_numpy(clip).permute(3, 0, 1, 2)[None] * 2 - 1
    raw = stack.vae.encode(video, sample=True, generator=torch.Generator().manual_seed(7))
    got = upsample_latents(stack.upsampler, stack.vae, raw, normalized=False, renormalize=False)
    assert _max_diff(got, expected) <= ATOL


def test_filters_change_the_latents(stack: Stack) -> None:
    # Guards the parity above: each option must really act on these latents.
    latents = 3 * torch.randn(1, stack.vae.config.latent_channels, 2, 3, 4)
    plain = upsample_latents(stack.upsampler, stack.vae, latents)
    for params in (LatentUpsampleParams(adain_factor=1.0), LatentUpsampleParams(tone_map_compression_ratio=1.0)):
        assert _max_diff(upsample_latents(stack.upsampler, stack.vae, latents, params), plain) > 1e-3


def test_latent_path_refuses_bad_options_and_pairings(stack: Stack) -> None:
    latents = torch.zeros(1, stack.vae.config.latent_channels, 1, 2, 2)
    with pytest.raises(InvalidRequest, match=r"tone_map_compression_ratio: 1.5 is outside \[0, 1\]"):
        upsample_latents(stack.upsampler, stack.vae, latents, LatentUpsampleParams(tone_map_compression_ratio=1.5))
    with pytest.raises(InvalidRequest, match=r"adain_factor: -1.0 is outside \[0, 10\]"):
        upsample_latents(stack.upsampler, stack.vae, latents, LatentUpsampleParams(adain_factor=-1.0))
    other = LTX2LatentUpsampler(type(stack.upsampler.config)(in_channels=stack.vae.config.latent_channels * 2,
                                                            mid_channels=32, num_blocks_per_stage=1))
    with pytest.raises(CheckpointError, match="upsampler takes .*-channel latents but the model's video VAE makes"):
        upsample_latents(other, stack.vae, latents)
