"""Tiled VAE decode vs diffusers' tiled decode, and vs our untiled decode."""

from __future__ import annotations

import pytest
import torch

from tests.parity.test_wan_vae import _build
from vidloom.models.wan.vae_tiling import SpatialTiling

# fp32, same ops per tile and the same blend rule: observed 0.0; 1e-4 as for plain decode.
ATOL = 1e-4


@pytest.mark.parametrize("tile, stride, latent_hw", [(32, 24, (6, 9)), (16, 8, (5, 4)), (24, 24, (4, 7))])
def test_tiled_decode_matches_diffusers_tiled_decode(tile, stride, latent_hw):
    pair = _build("tiny")
    ref = pair.ref
    ref.enable_tiling(tile_sample_min_height=tile, tile_sample_min_width=tile,
                      tile_sample_stride_height=stride, tile_sample_stride_width=stride)
    z = torch.randn(1, 4, 2, *latent_hw, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = ref.decode(z, return_dict=False)[0]
    got = pair.ours.decode(z, tiling=SpatialTiling(tile=tile, stride=stride))
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= ATOL


def test_one_tile_covering_everything_equals_plain_decode():
    pair = _build("tiny")
    z = torch.randn(1, 4, 3, 2, 3, generator=torch.Generator().manual_seed(4))
    assert torch.equal(pair.ours.decode(z, tiling=SpatialTiling(tile=64, stride=64)), pair.ours.decode(z))


def test_tiled_progress_counts_every_tile_frame():
    pair = _build("tiny")
    calls = []
    z = torch.randn(1, 4, 2, 4, 4)
    pair.ours.decode(z, progress=lambda done, total: calls.append((done, total)), tiling=SpatialTiling(16, 16))
    assert calls == [(i, 8) for i in range(1, 9)]  # 2x2 tiles x 2 latent frames


def test_bad_tiling_is_rejected():
    with pytest.raises(ValueError):
        SpatialTiling(tile=16, stride=32)
    pair = _build("tiny")
    with pytest.raises(ValueError, match="multiples of 8"):
        pair.ours.decode(torch.randn(1, 4, 1, 4, 4), tiling=SpatialTiling(tile=20, stride=12))
