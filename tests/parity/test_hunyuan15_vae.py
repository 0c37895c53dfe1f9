"""Hunyuan15VAE against diffusers' AutoencoderKLHunyuanVideo15: same state dict, same outputs."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import pytest
import torch
from diffusers import AutoencoderKLHunyuanVideo15

from tests.helpers.config_keys import assert_policy_classified, assert_refuses_unknown
from tests.helpers.hunyuan15_vae import perturb_norm_gains, tiny_vae_config
from vidloom.core.errors import CheckpointError
from vidloom.families.hunyuan15.vae import VAE_POLICY, Hunyuan15VAE, Hunyuan15VAEConfig
from vidloom.layers.tiling import SpatialTiling

# fp32 on CPU, the same ops in the same order but for the attention (frame by frame instead of one masked
# call) and the RMS norm (one division fewer); observed <= 5.3e-6 (wide, encode_sample).
ATOL = 1e-5


@dataclass(frozen=True)
class Case:
    config: dict
    frames: tuple[int, ...]
    """Video frame counts to encode (1 + temporal*k; 1 is an image)."""
    size: tuple[int, int]
    """Video height, width (multiples of the spatial ratio)."""
    latents: tuple[tuple[int, ...], ...]
    """Latent shapes to decode."""


CASES = {
    # 8x / 4x, every resample changes channels, one resnet per stage; time halved in the last two stages.
    "tiny": Case(tiny_vae_config(), (1, 5, 13), (16, 24), ((2, 4, 3, 2, 3), (1, 4, 1, 3, 2))),
    # 16x / 2x with a stage after the last resample, two resnets per stage, encoder resamples keeping their
    # channels (stage entries project instead), time halved only in the last resample; 8 latent channels.
    "wide": Case(
        tiny_vae_config(block_out_channels=[8, 8, 16, 32, 32], layers_per_block=2, latent_channels=8,
                        spatial_compression_ratio=16, temporal_compression_ratio=2, downsample_match_channel=False),
        (1, 7), (32, 48), ((1, 8, 4, 2, 3), (2, 8, 2, 1, 2)),
    ),
}


@dataclass
class Pair:
    ours: Hunyuan15VAE
    ref: AutoencoderKLHunyuanVideo15
    case: Case


@functools.cache
def _build(name: str) -> Pair:
    case = CASES[name]
    torch.manual_seed(sum(map(ord, name)))
    ref = AutoencoderKLHunyuanVideo15.from_config(case.config).eval()
    perturb_norm_gains(ref, seed=1)
    # diffusers 0.42's causal attention mask [B, N, N] does not broadcast over a batch of two or more (SDPA
    # raises); sliced, the reference runs each video alone, which is what a batch means.
    ref.enable_slicing()
    ours = Hunyuan15VAE.from_config(case.config)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return Pair(ours, ref, case)


@pytest.fixture(params=sorted(CASES))
def pair(request: pytest.FixtureRequest) -> Pair:
    return _build(request.param)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


def test_state_dict_keys_and_shapes_are_diffusers(pair: Pair) -> None:
    ours, theirs = pair.ours.state_dict(), pair.ref.state_dict()
    assert list(ours) == list(theirs)
    assert all(ours[k].shape == theirs[k].shape for k in ours)


def test_decode_matches_diffusers(pair: Pair) -> None:
    cfg = pair.ours.config
    for shape in pair.case.latents:
        latents = torch.randn(shape, generator=torch.Generator().manual_seed(shape[2]))
        with torch.no_grad():
            expected = pair.ref.decode(latents).sample
        got = pair.ours.decode(latents)
        b, _, t, h, w = shape
        assert got.shape == (b, 3, 1 + cfg.temporal_factor * (t - 1), h * cfg.spatial_factor, w * cfg.spatial_factor)
        assert _max_diff(got, expected) <= ATOL
        assert 0.1 < got.std().item() < 10  # random weights neither vanish nor blow up: the comparison means something


@pytest.mark.parametrize("name, frames", [(name, frames) for name in sorted(CASES) for frames in CASES[name].frames])
def test_encode_mode_and_sample_match_diffusers(name: str, frames: int) -> None:
    pair = _build(name)
    cfg = pair.ours.config
    video = torch.rand(1, 3, frames, *pair.case.size, generator=torch.Generator().manual_seed(frames)) * 2 - 1
    with torch.no_grad():
        dist = pair.ref.encode(video).latent_dist
        ref_gen = torch.Generator().manual_seed(7)
        expected_sample = dist.sample(generator=ref_gen)
    mode = pair.ours.encode_mode(video)
    assert mode.shape == (1, cfg.latent_channels, cfg.latent_frames(frames),
                          pair.case.size[0] // cfg.spatial_factor, pair.case.size[1] // cfg.spatial_factor)
    assert _max_diff(mode, dist.mode()) <= ATOL
    our_gen = torch.Generator().manual_seed(7)
    assert _max_diff(pair.ours.encode_sample(video, our_gen), expected_sample) <= ATOL
    # The same draws were consumed: both generators continue alike.
    assert torch.equal(torch.randn(4, generator=our_gen), torch.randn(4, generator=ref_gen))


def test_tiled_decode_and_encode_match_diffusers_tiling(pair: Pair) -> None:
    factor, cfg = pair.ours.config.spatial_factor, pair.ours.config
    tile = 4 * factor  # diffusers: 4 latent cells per tile, stride int(4 * 0.75) = 3, blend int(tile * 0.25)
    tiling = SpatialTiling(tile=tile, stride=3 * factor)
    pair.ref.enable_tiling(tile_sample_min_height=tile, tile_sample_min_width=tile,
                           tile_latent_min_height=4, tile_latent_min_width=4, tile_overlap_factor=0.25)
    try:
        for hw in ((5, 4), (3, 4)):  # the last fits one tile: coded whole, as the reference does
            latents = torch.randn(1, cfg.latent_channels, 2, *hw, generator=torch.Generator().manual_seed(3))
            video = torch.rand(1, 3, 1 + cfg.temporal_factor, hw[0] * factor, hw[1] * factor) * 2 - 1
            with torch.no_grad():
                expected = pair.ref.decode(latents).sample
                expected_mode = pair.ref.encode(video).latent_dist.mode()
            got = pair.ours.decode(latents, tiling=tiling)
            got_mode = pair.ours.encode_mode(video, tiling=tiling)
            assert _max_diff(got, expected) <= ATOL
            assert _max_diff(got_mode, expected_mode) <= ATOL
            # Blended seams differ from a whole pass (the check is not vacuous); one tile is a whole pass.
            assert (_max_diff(got, pair.ours.decode(latents)) == 0) == (max(hw) <= 4)
            assert (_max_diff(got_mode, pair.ours.encode_mode(video)) == 0) == (max(hw) <= 4)
    finally:
        pair.ref.use_tiling = False


def test_bad_inputs_are_refused(pair: Pair) -> None:
    cfg = pair.ours.config
    h, w = pair.case.size
    with pytest.raises(ValueError, match=f"1 \\+ {cfg.temporal_factor}\\*k frames"):
        pair.ours.encode_mode(torch.zeros(1, 3, 2 + cfg.temporal_factor, h, w))
    with pytest.raises(ValueError, match=f"multiples of {cfg.spatial_factor}"):
        pair.ours.encode_mode(torch.zeros(1, 3, 1, h + cfg.spatial_factor // 2, w))
    with pytest.raises(ValueError, match="latents must be"):
        pair.ours.decode(torch.zeros(1, cfg.latent_channels + 1, 1, 2, 2))
    # A tile off the latent grid is refused even where the input would fit one tile.
    odd = SpatialTiling(tile=cfg.spatial_factor * 4 + 1, stride=cfg.spatial_factor)
    with pytest.raises(ValueError, match=f"multiples of {cfg.spatial_factor}"):
        pair.ours.decode(torch.zeros(1, cfg.latent_channels, 1, 1, 1), tiling=odd)
    with pytest.raises(ValueError, match=f"multiples of {cfg.spatial_factor}"):
        pair.ours.encode_mode(torch.zeros(1, 3, 1, cfg.spatial_factor, cfg.spatial_factor), tiling=odd)


def test_config_reads_every_reference_key_and_refuses_unknown_ones() -> None:
    assert_policy_classified(AutoencoderKLHunyuanVideo15, VAE_POLICY)
    assert_refuses_unknown(Hunyuan15VAEConfig.from_diffusers, errors=(CheckpointError,))
    # The reference's defaults are the published VAE (hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-*/vae).
    published = {p.name: p.default for p in inspect.signature(AutoencoderKLHunyuanVideo15.__init__).parameters.values()
                 if p.name != "self"}
    cfg = Hunyuan15VAEConfig.from_diffusers(published)
    assert (cfg.spatial_factor, cfg.temporal_factor, cfg.latent_channels, cfg.scaling_factor) == (16, 4, 32, 1.03682)
    assert Hunyuan15VAEConfig.from_diffusers(cfg.to_diffusers()) == cfg


@pytest.mark.parametrize("key, value", [
    ("layers_per_block", 0),
    ("latent_channels", 2.5),
    ("downsample_match_channel", "yes"),
    ("scaling_factor", -1.0),
    ("block_out_channels", []),
    ("block_out_channels", [8, 12, 32, 32]),  # 8 -> 12 channels cannot be regrouped by a 2x2 resample
    ("block_out_channels", [8, 16, 32]),  # three stages cannot hold three resamples that match channels
    ("spatial_compression_ratio", 12),
    ("temporal_compression_ratio", 16),
])
def test_a_bad_value_is_refused_naming_its_key(key: str, value: object) -> None:
    with pytest.raises(CheckpointError, match=key):
        Hunyuan15VAEConfig.from_diffusers(tiny_vae_config(**{key: value}))


def test_the_family_loader_reads_vae_folders_strictly(tmp_path) -> None:
    # load_vae: the saved diffusers `vae/` folder as our Hunyuan15VAE, every tensor; an extra or a missing tensor
    # is refused naming it.
    from safetensors.torch import load_file, save_file

    from vidloom.families.hunyuan15.load import load_vae

    pair = _build("tiny")
    pair.ref.save_pretrained(str(tmp_path))
    vae = load_vae(tmp_path, torch.device("cpu"), torch.float32)
    assert isinstance(vae, Hunyuan15VAE)
    assert all(torch.equal(vae.state_dict()[k], v) for k, v in pair.ref.state_dict().items())
    (file,) = tmp_path.glob("*.safetensors")
    tensors = load_file(str(file))
    save_file({**tensors, "decoder.extra.weight": torch.zeros(1)}, str(file))
    with pytest.raises(CheckpointError, match="decoder.extra.weight"):
        load_vae(tmp_path, torch.device("cpu"), torch.float32)
    dropped = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != dropped}, str(file))
    with pytest.raises(CheckpointError, match=f"missing tensors? '{dropped}'"):
        load_vae(tmp_path, torch.device("cpu"), torch.float32)
