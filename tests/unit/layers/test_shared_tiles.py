"""A tiled decode split over ranks (layers.tiling.shared_tiles), ranks as threads: each rank decodes every P-th
tile, the tiles are exchanged, and the blended result equals the one-device decode bit for bit."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.layers.tiling import SpatialTiling, decode_tiles_2d, shared_tiles, tiles_here

FACTOR = 4


def _decoder(calls: list[tuple[int, int]]):
    """A stand-in VAE decoder with the real shape rule (latent cell -> FACTOR x FACTOR pixels, 3 channels, frames
    kept) whose values depend on every input cell of the tile, so a tile put in the wrong place shows."""
    weight = torch.randn(3, 2, generator=torch.Generator().manual_seed(0))

    def decode(tile: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(tile.shape[-2:]))
        mixed = torch.einsum("oc,bcfhw->bofhw", weight, tile) + tile.mean()
        return mixed.repeat_interleave(FACTOR, dim=-2).repeat_interleave(FACTOR, dim=-1)

    return decode


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize(("height", "width"), [(10, 14), (5, 9), (4, 4)])
def test_ranks_share_the_tiles_and_get_the_one_device_decode(size, height, width):
    latents = torch.randn(1, 2, 3, height, width, generator=torch.Generator().manual_seed(height * width))
    tiling = SpatialTiling(tile=6 * FACTOR, stride=4 * FACTOR)
    alone: list[tuple[int, int]] = []
    expected = decode_tiles_2d(latents, _decoder(alone), tiling, FACTOR)

    def rank(comm):
        calls: list[tuple[int, int]] = []
        with shared_tiles(comm):
            out = decode_tiles_2d(latents, _decoder(calls), tiling, FACTOR)
            counted = tiles_here(len(alone))
        return out, len(calls), counted

    results = run_ranks(thread_group(size), rank)
    for out, decoded, counted in results:
        assert torch.equal(out, expected)
        assert decoded == counted
    if len(alone) >= size:  # every tile decoded once across the ranks
        assert sum(decoded for _, decoded, _ in results) == len(alone)
    else:  # fewer tiles than ranks: each decodes them all
        assert all(decoded == len(alone) for _, decoded, _ in results)
