"""LTX2VideoVAE against diffusers' AutoencoderKLLTX2Video: same checkpoint folder, same outputs."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKLLTX2Video
from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline
from diffusers.utils.torch_utils import randn_tensor

from tests.helpers.ltx2_vae_fixtures import VAE_A, VAE_A_TIMESTEP, VAE_B, VAE_CONFIGS, TinyVideoVAE, write_video_vae
from vidloom.core.errors import InvalidRequest
from vidloom.models.ltx2.checkpoint import load_video_vae
from vidloom.models.ltx2.video_vae import LTX2_VIDEO_VAE_NAME_MAP, LTX2VideoVAE
from vidloom.models.wan.vae_tiling import SpatialTiling

# fp32 CPU, the same ops in the same order: measured differences are 0; 1e-5 leaves room for a
# different CPU's conv kernels.
ATOL = 1e-5


@dataclass
class Pair:
    spec: TinyVideoVAE
    ours: LTX2VideoVAE
    ref: AutoencoderKLLTX2Video
    folder: Path


@pytest.fixture(scope="module", params=VAE_CONFIGS, ids=lambda s: s.name)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    spec: TinyVideoVAE = request.param
    folder = tmp_path_factory.mktemp(spec.name)
    ref = write_video_vae(folder, spec)
    return Pair(spec, load_video_vae(folder), ref, folder)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


def _timestep(pair: Pair, batch: int) -> torch.Tensor | None:
    return torch.linspace(0.05, 0.4, batch) if pair.ours.config.timestep_conditioning else None


def test_name_map_covers_the_checkpoint(pair: Pair) -> None:
    ckpt_keys = list(pair.ref.state_dict())
    module_keys = [LTX2_VIDEO_VAE_NAME_MAP.to_module(k) for k in ckpt_keys]
    assert sorted(module_keys) == sorted(pair.ours.state_dict())
    assert all(LTX2_VIDEO_VAE_NAME_MAP.to_checkpoint(m) == c for c, m in zip(ckpt_keys, module_keys))
    assert any(c != m for c, m in zip(ckpt_keys, module_keys))


def test_compression_ratios_and_statistics_match(pair: Pair) -> None:
    assert pair.ours.spatial_compression_ratio == pair.ref.spatial_compression_ratio
    assert pair.ours.temporal_compression_ratio == pair.ref.temporal_compression_ratio
    assert torch.equal(pair.ours.latents_mean, pair.ref.latents_mean)
    assert torch.equal(pair.ours.latents_std, pair.ref.latents_std)
    assert pair.ours.scaling_factor == pair.ref.config.scaling_factor


def test_encode_matches_diffusers(pair: Pair) -> None:
    video = torch.rand(pair.spec.video_shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        posterior = pair.ref.encode(video).latent_dist
        expected_sample = posterior.sample(torch.Generator().manual_seed(7))
    mode = pair.ours.encode(video)
    b, _, f, h, w = video.shape
    s, t = pair.ours.spatial_compression_ratio, pair.ours.temporal_compression_ratio
    assert mode.shape == (b, pair.ours.config.latent_channels, 1 + (f - 1) // t, h // s, w // s)
    assert _max_diff(mode, posterior.mode()) <= ATOL
    sample = pair.ours.encode(video, sample=True, generator=torch.Generator().manual_seed(7))
    assert _max_diff(sample, expected_sample) <= ATOL
    assert _max_diff(sample, mode) > 1e-3  # the sample really carries noise


def test_single_frame_encode_matches_diffusers(pair: Pair) -> None:
    # LTX2ImageToVideoPipeline encodes the conditioning image as a 1-frame video and takes the mode.
    b, c, _, h, w = pair.spec.video_shape
    image = torch.rand((b, c, 1, h, w), generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.no_grad():
        expected = pair.ref.encode(image).latent_dist.mode()
    assert _max_diff(pair.ours.encode(image), expected) <= ATOL


def test_decode_matches_diffusers(pair: Pair) -> None:
    latents = torch.randn(pair.spec.latent_shape, generator=torch.Generator().manual_seed(3))
    timestep = _timestep(pair, latents.shape[0])
    torch.manual_seed(11)  # diffusers' decoder draws its injected noise from the global RNG
    with torch.no_grad():
        expected = pair.ref.decode(latents, timestep).sample
    torch.manual_seed(11)
    got = pair.ours.decode(latents, timestep)
    b, _, f, h, w = latents.shape
    s, t = pair.ours.spatial_compression_ratio, pair.ours.temporal_compression_ratio
    assert got.shape == (b, 3, 1 + t * (f - 1), s * h, s * w)
    assert _max_diff(got, expected) <= ATOL
    assert expected.std() > 0.05


def test_timestep_changes_the_decode() -> None:
    # Guards the comparison above: with conditioning on, the timestep must move the pixels.
    vae = LTX2VideoVAE(_config(VAE_A_TIMESTEP)).eval()
    latents = torch.randn(VAE_A_TIMESTEP.latent_shape)
    torch.manual_seed(0)
    early = vae.decode(latents, 0.0)
    torch.manual_seed(0)
    late = vae.decode(latents, 0.5)
    assert _max_diff(early, late) > 1e-3


def test_decode_normalized_matches_ltx2_pipeline_tail(pair: Pair) -> None:
    # LTX2Pipeline after denoising: noise mix (timestep-conditioned VAEs only), denormalise, decode.
    latents = torch.randn(pair.spec.latent_shape, generator=torch.Generator().manual_seed(4))
    batch = latents.shape[0]
    times, scales = [0.05 * (i + 1) for i in range(batch)], [0.1] * batch
    timestep = None
    mixed = latents
    if pair.ours.config.timestep_conditioning:
        noise = randn_tensor(latents.shape, generator=torch.Generator().manual_seed(5), dtype=latents.dtype)
        timestep = torch.tensor(times)
        mixed = (1 - torch.tensor(scales)[:, None, None, None, None]) * latents + 0.1 * noise
    raw = LTX2Pipeline._denormalize_latents(mixed, pair.ref.latents_mean, pair.ref.latents_std,
                                            pair.ref.config.scaling_factor)
    torch.manual_seed(12)
    with torch.no_grad():
        expected = pair.ref.decode(raw, timestep).sample
    torch.manual_seed(12)
    got = pair.ours.decode_normalized(latents, times, scales, generator=torch.Generator().manual_seed(5))
    assert _max_diff(got, expected) <= ATOL


def test_latent_normalisation_matches_the_pipelines(pair: Pair) -> None:
    latents = torch.randn(pair.spec.latent_shape)
    mean, std, scale = pair.ref.latents_mean, pair.ref.latents_std, pair.ref.config.scaling_factor
    assert torch.equal(pair.ours.normalize_latents(latents), LTX2Pipeline._normalize_latents(latents, mean, std, scale))
    assert torch.equal(pair.ours.denormalize_latents(latents),
                       LTX2Pipeline._denormalize_latents(latents, mean, std, scale))
    # The image-to-video pipeline normalises its encoded image with scaling 1.0.
    assert torch.equal(pair.ours.normalize_latents(latents, 1.0), LTX2Pipeline._normalize_latents(latents, mean, std))


# -- bad input --------------------------------------------------------------------------------------


def _config(spec: TinyVideoVAE):
    from vidloom.models.ltx2.video_vae import LTX2VideoVAEConfig

    return LTX2VideoVAEConfig.from_diffusers(spec.config)


@pytest.fixture(scope="module")
def small_vae() -> LTX2VideoVAE:
    return LTX2VideoVAE(_config(VAE_A)).eval()


@pytest.mark.parametrize("frames", [2, 8, 10, 16])
def test_encode_refuses_frames_off_the_grid(small_vae: LTX2VideoVAE, frames: int) -> None:
    with pytest.raises(InvalidRequest, match=rf"video: {frames} frames; .* 1 \+ 8\*k") as err:
        small_vae.encode(torch.zeros(1, 3, frames, 32, 32))
    assert err.value.field == "video"


def test_encode_refuses_sizes_off_the_grid(small_vae: LTX2VideoVAE) -> None:
    with pytest.raises(InvalidRequest, match="48x32 is not a multiple of 32"):
        small_vae.encode(torch.zeros(1, 3, 9, 48, 32))
    with pytest.raises(InvalidRequest, match=r"\[batch, 3, frames"):
        small_vae.encode(torch.zeros(1, 4, 9, 32, 32))


def test_decode_refuses_wrong_latents(small_vae: LTX2VideoVAE) -> None:
    with pytest.raises(InvalidRequest, match=r"latents: expected \[batch, 8, .*got \(1, 16, 2, 2, 2\)"):
        small_vae.decode(torch.zeros(1, 16, 2, 2, 2))
    with pytest.raises(InvalidRequest, match="latents"):
        small_vae.decode(torch.zeros(8, 2, 2, 2))
    with pytest.raises(InvalidRequest, match="latent size 1x2 is below the 2x2"):
        small_vae.decode(torch.zeros(1, 8, 2, 1, 2))


def test_decode_timestep_must_match_the_checkpoint(small_vae: LTX2VideoVAE) -> None:
    with pytest.raises(InvalidRequest, match="timestep: .*no timestep conditioning"):
        small_vae.decode(torch.zeros(1, 8, 1, 2, 2), 0.05)
    conditioned = LTX2VideoVAE(_config(VAE_A_TIMESTEP)).eval()
    with pytest.raises(InvalidRequest, match="timestep: .*pass the decode timestep"):
        conditioned.decode(torch.zeros(1, 8, 1, 2, 2))
    with pytest.raises(InvalidRequest, match="timestep: expected one value per batch item"):
        conditioned.decode(torch.zeros(2, 8, 1, 2, 2), torch.tensor([0.1, 0.2, 0.3]))
    with pytest.raises(InvalidRequest, match="decode_timestep: 3 values for a batch of 2"):
        conditioned.decode_normalized(torch.zeros(2, 8, 1, 2, 2), [0.1, 0.2, 0.3])


def test_vae_b_is_a_different_layout() -> None:
    # Guards the fixture: the second config really exercises the other code paths.
    config = _config(VAE_B)
    assert (config.spatial_compression_ratio, config.temporal_compression_ratio) == (32, 4)
    vae = LTX2VideoVAE(config)
    assert any(stage.conv_in is not None for stage in vae.decoder.up_blocks)
    assert not config.encoder_causal and not config.decoder_causal


# -- tiled decode -----------------------------------------------------------------------------------


def test_tiled_decode_matches_diffusers_tiling(pair: Pair) -> None:
    # Three latent cells per tile every two: edge tiles keep two cells, which reflect padding needs.
    s = pair.ours.spatial_compression_ratio
    tiling = SpatialTiling(tile=3 * s, stride=2 * s)
    b, c, f, _, _ = pair.spec.latent_shape
    latents = torch.randn((b, c, f, 4, 6), generator=torch.Generator().manual_seed(6))
    timestep = _timestep(pair, b)
    ref = copy.deepcopy(pair.ref)  # enable_tiling is state on the module
    ref.enable_tiling(tile_sample_min_height=3 * s, tile_sample_min_width=3 * s,
                      tile_sample_stride_height=2 * s, tile_sample_stride_width=2 * s)
    torch.manual_seed(13)
    with torch.no_grad():
        expected = ref.decode(latents, timestep).sample
    torch.manual_seed(13)
    got = pair.ours.decode(latents, timestep, tiling=tiling)
    assert _max_diff(got, expected) <= ATOL
    torch.manual_seed(13)
    whole = pair.ours.decode(latents, timestep)
    assert _max_diff(got, whole) > 1e-4  # the tiles really were decoded apart


def test_tiling_is_skipped_for_a_latent_within_one_tile(small_vae: LTX2VideoVAE) -> None:
    latents = torch.randn(1, 8, 1, 2, 3)
    assert torch.equal(small_vae.decode(latents, tiling=SpatialTiling(tile=96, stride=64)), small_vae.decode(latents))


def test_tiling_refuses_bad_geometry(small_vae: LTX2VideoVAE) -> None:
    latents = torch.zeros(1, 8, 1, 4, 5)
    with pytest.raises(InvalidRequest, match=r"tiling: tile \(80\) and stride \(64\) must be multiples of 32"):
        small_vae.decode(latents, tiling=SpatialTiling(tile=80, stride=64))
    with pytest.raises(InvalidRequest, match="tiling: stride 64 leaves a 1-cell edge tile on a 4x5 latent"):
        small_vae.decode(latents, tiling=SpatialTiling(tile=96, stride=64))


def test_bf16_matches_diffusers_in_bf16(tmp_path: Path) -> None:
    # Loaded straight into bf16 (no fp32 copy); the same ops in the same dtype agree exactly here.
    ref = write_video_vae(tmp_path, VAE_A_TIMESTEP).to(torch.bfloat16)
    ours = load_video_vae(tmp_path, dtype=torch.bfloat16)
    latents = torch.randn(VAE_A_TIMESTEP.latent_shape).to(torch.bfloat16)
    timestep = torch.tensor([0.05, 0.2], dtype=torch.bfloat16)
    torch.manual_seed(14)
    with torch.no_grad():
        expected = ref.decode(latents, timestep).sample
        encoded = ref.encode(expected[:, :, :9, :32, :32]).latent_dist.mode()
    torch.manual_seed(14)
    got = ours.decode(latents, timestep)
    assert got.dtype == torch.bfloat16
    assert _max_diff(got.float(), expected.float()) <= 1e-2  # bf16 resolution
    assert _max_diff(ours.encode(expected[:, :, :9, :32, :32]).float(), encoded.float()) <= 1e-2
