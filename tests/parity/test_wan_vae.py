"""WanVAE against diffusers' AutoencoderKLWan: same weights, same outputs."""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass

import pytest
import torch
from diffusers import AutoencoderKLWan

from vidloom.core.errors import CheckpointError
from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig

# fp32 on CPU running the same ops in the same order; what is left is reordering noise
# in conv/attention reductions, which accumulates over ~30 convs per pass.
ATOL = 1e-4


@dataclass
class Pair:
    ours: WanVAE
    ref: AutoencoderKLWan
    video_shape: tuple[int, ...]
    latent_shapes: tuple[tuple[int, ...], ...]


# (config, video [B, 3, F, H, W], latents [B, z, T, h, w] to decode); sizes are non-square.
CASES = {
    "tiny": (
        dict(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1),
        (2, 3, 9, 16, 24),
        ((2, 4, 3, 2, 3), (1, 4, 1, 3, 2)),
    ),
    "wan21_shape": (
        dict(base_dim=16, z_dim=16, dim_mult=(1, 2, 4, 4), num_res_blocks=2),
        (1, 3, 5, 24, 16),
        ((1, 16, 3, 2, 3), (2, 16, 2, 3, 2)),
    ),
    # Time halved at the other end of the encoder, to exercise the stream bookkeeping.
    "early_time_downsample": (
        dict(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1, temporal_downsample=(True, True, False)),
        (1, 3, 9, 16, 8),
        ((2, 4, 3, 2, 1),),
    ),
    # Wan2.2 (TI2V-5B layout): residual stages, 2x2 patching, a wider decoder, 16x spatial compression.
    "wan22_residual": (
        dict(base_dim=8, decoder_base_dim=12, z_dim=6, dim_mult=(1, 2, 2, 2), num_res_blocks=1, is_residual=True,
             patch_size=2, in_channels=12, out_channels=12),
        (1, 3, 9, 32, 48),
        ((1, 6, 3, 2, 3), (2, 6, 1, 3, 2)),
    ),
    "wan22_two_blocks": (
        dict(base_dim=8, z_dim=8, dim_mult=(1, 2, 4, 4), num_res_blocks=2, is_residual=True,
             patch_size=2, in_channels=12, out_channels=12),
        (2, 3, 5, 16, 32),
        ((1, 8, 2, 2, 1),),
    ),
}


def _build(name: str) -> Pair:
    arch, video_shape, latent_shapes = CASES[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    z_dim = arch["z_dim"]
    config = WanVAEConfig(
        **arch,
        latents_mean=tuple((torch.randn(z_dim, generator=gen)).tolist()),
        latents_std=tuple((0.5 + 2 * torch.rand(z_dim, generator=gen)).tolist()),
    )
    torch.manual_seed(sum(map(ord, name)))
    ref = AutoencoderKLWan.from_config(config.to_diffusers()).eval()
    with torch.no_grad():
        # RMS gains start at one; perturb them so a mix-up between norms would show.
        for key, param in ref.named_parameters():
            if key.endswith("gamma"):
                param.add_(0.2 * torch.randn_like(param))
    ours = WanVAE(config)
    ours.load_state_dict({WAN_VAE_NAME_MAP.to_module(k): v for k, v in ref.state_dict().items()}, strict=True)
    return Pair(ours, ref, video_shape, latent_shapes)


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request: pytest.FixtureRequest) -> Pair:
    return _build(request.param)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


def test_name_map_is_a_bijection(pair: Pair) -> None:
    ckpt_keys = list(pair.ref.state_dict())
    module_keys = [WAN_VAE_NAME_MAP.to_module(k) for k in ckpt_keys]
    assert sorted(module_keys) == sorted(pair.ours.state_dict())
    assert len(set(module_keys)) == len(ckpt_keys)
    for ckpt_key, module_key in zip(ckpt_keys, module_keys):
        assert WAN_VAE_NAME_MAP.to_checkpoint(module_key) == ckpt_key
    # Some keys are really renamed, so the map is not vacuous.
    assert any(c != m for c, m in zip(ckpt_keys, module_keys))


def test_decode_matches_diffusers(pair: Pair) -> None:
    for shape in pair.latent_shapes:
        latents = torch.randn(shape)
        with torch.no_grad():
            expected = pair.ref.decode(latents).sample
        got = pair.ours.decode(latents)
        b, _, t, h, w = shape
        f, hw = pair.ours.config.temporal_factor, pair.ours.config.spatial_factor
        assert got.shape == (b, 3, 1 + f * (t - 1), hw * h, hw * w)
        assert _max_diff(got, expected) <= ATOL
        # Random weights must not saturate the clamp, or the comparison would be empty.
        assert (got.abs() < 1).float().mean() > 0.5


def test_encode_matches_diffusers(pair: Pair) -> None:
    video = torch.rand(pair.video_shape) * 2 - 1
    with torch.no_grad():
        expected = pair.ref.encode(video).latent_dist
        expected_sample = expected.sample(generator=torch.Generator().manual_seed(7))
    got = pair.ours.encode(video)
    b, _, f, h, w = pair.video_shape
    hw = pair.ours.config.spatial_factor
    assert got.mean.shape == (b, pair.ours.config.z_dim, 1 + (f - 1) // 4, h // hw, w // hw)
    assert _max_diff(got.mean, expected.mean) <= ATOL
    assert _max_diff(got.logvar, expected.logvar) <= ATOL
    assert _max_diff(got.sample(torch.Generator().manual_seed(7)), expected_sample) <= ATOL


def test_single_frame_encode_matches_diffusers(pair: Pair) -> None:
    # An image is a 1-frame video: only the first-frame chunk runs.
    video = torch.rand(pair.video_shape[:2] + (1,) + pair.video_shape[3:]) * 2 - 1
    with torch.no_grad():
        expected = pair.ref.encode(video).latent_dist
    got = pair.ours.encode(video)
    assert got.mean.shape[2] == 1
    assert _max_diff(got.mean, expected.mean) <= ATOL
    assert _max_diff(got.logvar, expected.logvar) <= ATOL


def test_latent_normalisation_matches_wan_pipelines(pair: Pair) -> None:
    cfg = pair.ref.config
    latents = torch.randn(2, cfg.z_dim, 3, 2, 3)
    # As WanPipeline.__call__ does right before vae.decode, and WanImageToVideoPipeline
    # does to the encoded condition.
    mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(latents.device, latents.dtype)
    inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(latents.device, latents.dtype)
    assert torch.equal(pair.ours.denormalize_latents(latents), latents / inv_std + mean)
    assert torch.equal(pair.ours.normalize_latents(latents), (latents - mean) * inv_std)


def test_progress_reports_each_latent_frame(pair: Pair) -> None:
    calls: list[tuple[int, int]] = []
    pair.ours.decode(torch.randn(1, pair.ours.config.z_dim, 3, 1, 1), progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 3), (2, 3), (3, 3)]


@pytest.mark.parametrize("frames", [2, 4, 8, 10])
def test_encode_rejects_frame_counts_off_the_grid(frames: int) -> None:
    vae = WanVAE(WanVAEConfig(base_dim=8, z_dim=4, latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4))
    with pytest.raises(ValueError, match="1 \\+ 4\\*k"):
        vae.encode(torch.zeros(1, 3, frames, 16, 16))


def test_config_round_trips(pair: Pair) -> None:
    config = pair.ours.config
    assert WanVAEConfig.from_diffusers(config.to_diffusers()) == config
    # What diffusers stores (with its own extra keys) reads back to the same config.
    assert WanVAEConfig.from_diffusers(dict(pair.ref.config)) == config
    assert (config.spatial_factor, config.temporal_factor) == (16 if config.patch_size else 8, 4)


def test_config_defaults_are_wan21() -> None:
    # The keys of the published Wan2.1 diffusers config.json, statistics left to defaults.
    published = {
        "_class_name": "AutoencoderKLWan",
        "_diffusers_version": "0.33.0.dev0",
        "attn_scales": [],
        "base_dim": 96,
        "dim_mult": [1, 2, 4, 4],
        "dropout": 0.0,
        "num_res_blocks": 2,
        "temperal_downsample": [False, True, True],
        "z_dim": 16,
    }
    config = WanVAEConfig.from_diffusers(published)
    assert config == WanVAEConfig()
    # Building a full-size model to read its config is slow; its defaults live in the signature.
    defaults = inspect.signature(AutoencoderKLWan.__init__).parameters
    assert list(config.latents_mean) == defaults["latents_mean"].default
    assert list(config.latents_std) == defaults["latents_std"].default


def test_wan22_published_config_reads() -> None:
    # The keys of the published Wan2.2 TI2V-5B vae/config.json (statistics shortened to z_dim entries).
    published = {
        "_class_name": "AutoencoderKLWan", "attn_scales": [], "base_dim": 160, "decoder_base_dim": 256,
        "dim_mult": [1, 2, 4, 4], "dropout": 0.0, "in_channels": 12, "is_residual": True,
        "latents_mean": [0.0] * 48, "latents_std": [1.0] * 48, "num_res_blocks": 2, "out_channels": 12,
        "patch_size": 2, "scale_factor_spatial": 16, "scale_factor_temporal": 4,
        "temperal_downsample": [False, True, True], "z_dim": 48,
    }
    config = WanVAEConfig.from_diffusers(published)
    assert (config.z_dim, config.spatial_factor, config.temporal_factor, config.decoder_dim) == (48, 16, 4, 256)
    assert config.is_residual and config.patch_size == 2


@pytest.mark.parametrize("field,value", [("attn_scales", [0.5]), ("_class_name", "AutoencoderKL")])
def test_unsupported_configs_are_refused(field: str, value: object) -> None:
    cfg = WanVAEConfig().to_diffusers() | {field: value}
    with pytest.raises(CheckpointError, match=field):
        WanVAEConfig.from_diffusers(cfg)


def test_inconsistent_config_is_refused() -> None:
    cfg = WanVAEConfig().to_diffusers() | {"z_dim": 8}
    with pytest.raises(CheckpointError, match="latents_mean"):
        WanVAEConfig.from_diffusers(cfg)
    cfg = WanVAEConfig().to_diffusers() | {"temperal_downsample": [False, True]}
    with pytest.raises(CheckpointError, match="temporal_downsample"):
        WanVAEConfig.from_diffusers(cfg)


def test_concurrent_decodes_share_one_module() -> None:
    vae = _build("tiny").ours
    inputs = [torch.randn(1, 4, 3, 2, 3), torch.randn(2, 4, 3, 1, 2)]
    sequential = [vae.decode(z) for z in inputs]

    # Both threads meet after every latent frame, so their per-frame decodes interleave:
    # any state kept on the module would be clobbered by the other call.
    barrier = threading.Barrier(len(inputs), timeout=30)
    results: list[torch.Tensor | None] = [None] * len(inputs)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = vae.decode(inputs[i], progress=lambda done, total: barrier.wait())
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for got, expected in zip(results, sequential):
        assert got is not None
        assert torch.equal(got, expected)
