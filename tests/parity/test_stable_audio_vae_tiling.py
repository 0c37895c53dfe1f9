"""Stable Audio's Oobleck decoder in windows over time (`vae_tile`, in waveform samples) vs diffusers'
AutoencoderOobleck with `enable_tiling`: same windows, same context cut. fp32 on CPU, the same ops per window:
observed 0.0; bound 1e-5. The untiled decode differs (the cut context is where a window loses receptive field)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.stable_audio_checkpoints import CONFIGS
from vidloom.layers.tiling import SpatialTiling
from vidloom.loading.name_map import NameMap
from vidloom.loading.safetensors_io import load_weights
from vidloom.families.stable_audio.vae import OobleckDecoderConfig, OobleckVAE

ATOL = 1e-5


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda spec: spec.name)
def pair(request, tmp_path_factory):
    from diffusers import AutoencoderOobleck

    torch.manual_seed(4)
    ref = AutoencoderOobleck(**request.param.vae).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for snake in [m for m in ref.modules() if type(m).__name__ == "Snake1d"]:
            snake.alpha.add_(torch.randn(snake.alpha.shape, generator=g) * 0.3)
    folder = tmp_path_factory.mktemp(request.param.name) / "vae"
    ref.save_pretrained(str(folder))
    ours = OobleckVAE(OobleckDecoderConfig.from_diffusers(json.loads((folder / "config.json").read_text())))
    load_weights(ours, folder, NameMap(()))
    return ref, ours.eval()


@pytest.mark.parametrize("chunk, overlap, frames", [(12, 2, 40), (9, 3, 23)])
def test_windowed_decode_matches_diffusers_enable_tiling(pair, chunk, overlap, frames):
    ref, ours = pair
    ref.enable_tiling()
    ref.tile_latent_min_length, ref.tile_latent_overlap = chunk, overlap
    hop = ours.config.hop_length
    z = torch.randn(1, ours.config.latent_channels, frames, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        expected = ref.decode(z).sample
    got = ours.decode(z, SpatialTiling(tile=chunk * hop, stride=(chunk - 2 * overlap) * hop))
    untiled = ours.decode(z)
    assert got.shape == expected.shape == untiled.shape == (1, ours.config.audio_channels, frames * hop)
    assert (got - expected).abs().max().item() <= ATOL
    assert (got - untiled).abs().max().item() > 1e-4  # the windows really ran


def test_a_latent_within_one_window_decodes_whole(pair):
    _, ours = pair
    hop = ours.config.hop_length
    z = torch.randn(1, ours.config.latent_channels, 10, generator=torch.Generator().manual_seed(7))
    assert torch.equal(ours.decode(z, SpatialTiling(tile=10 * hop, stride=4 * hop)), ours.decode(z))
