"""Tiles that blend into the output as they decode (layers.tiling.decode_tiles_2d) give the blend-all-at-the-end
rule's result bit for bit, over grids with short edge tiles, strides below half the tile and equal to it, factor 1,
other dtypes and a decoder that changes the leading axes; and no decoded tile is alive when the next one decodes."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import Tensor

from vidloom.layers.tiling import SpatialTiling, blend, decode_tiles_2d


def _blend_all_at_the_end(latents: Tensor, decode, tiling: SpatialTiling, factor: int) -> Tensor:
    """The rule as decode_tiles_2d ran it before tiles streamed: every tile decoded and kept, then each blended in
    raster order with the already-blended whole tiles above and to the left, cut to the stride and concatenated."""
    tile, stride = tiling.in_cells(factor)
    height, width = latents.shape[-2:]
    rows = [[decode(latents[..., i : i + tile, j : j + tile]) for j in range(0, width, stride)]
            for i in range(0, height, stride)]
    extent, keep = tiling.tile - tiling.stride, tiling.stride
    for r, row in enumerate(rows):
        for c in range(len(row)):
            if r > 0:
                row[c] = blend(rows[r - 1][c], row[c], extent, dim=-2)
            if c > 0:
                row[c] = blend(row[c - 1], row[c], extent, dim=-1)
    out = torch.cat([torch.cat([t[..., :keep, :keep] for t in row], dim=-1) for row in rows], dim=-2)
    return out[..., : height * factor, : width * factor]


def _decoder(factor: int, channels_in: int, live: list[weakref.ref] | None = None):
    """A stand-in decoder (cell -> factor x factor outputs, 3 channels) whose every output depends on the whole
    tile and on its place in the tile, so a misplaced or wrongly blended entry shows. `live` collects a weak
    reference to each output and asserts that none of the earlier ones is still alive at each call."""
    weight = torch.randn(3, channels_in, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def decode(tile: Tensor) -> Tensor:
        if live is not None:
            gc.collect()
            assert all(ref() is None for ref in live), "a decoded tile outlived its blend"
        mixed = torch.tanh(torch.einsum("oc,bc...->bo...", weight.to(tile.dtype), tile)) + tile.mean()
        mixed = mixed.repeat_interleave(factor, dim=-2).repeat_interleave(factor, dim=-1)
        h, w = mixed.shape[-2:]
        place = torch.arange(h, dtype=tile.dtype)[:, None] / 7 + torch.arange(w, dtype=tile.dtype) / 11
        out = mixed * (1 + place.sin() / 3)
        if live is not None:
            live.append(weakref.ref(out))
        return out

    return decode


@pytest.mark.parametrize("factor", [1, 4])
@pytest.mark.parametrize(("tile", "stride"), [(6, 4), (4, 4), (5, 2), (3, 1), (8, 3)])
@pytest.mark.parametrize(("height", "width"), [(1, 1), (5, 9), (10, 14), (7, 3), (13, 13)])
def test_streamed_blend_is_the_blend_at_the_end(factor, tile, stride, height, width):
    latents = torch.randn(1, 2, 3, height, width, generator=torch.Generator().manual_seed(height * 31 + width))
    tiling = SpatialTiling(tile=tile * factor, stride=stride * factor)
    decode = _decoder(factor, 2)
    expected = _blend_all_at_the_end(latents, decode, tiling, factor)
    out = decode_tiles_2d(latents, decode, tiling, factor)
    assert out.shape == (1, 3, 3, height * factor, width * factor)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes_and_an_image_latent(dtype):
    latents = torch.randn(2, 4, 11, 9, generator=torch.Generator().manual_seed(3)).to(dtype)  # [B, C, h, w]
    tiling = SpatialTiling(tile=40, stride=24)
    decode = _decoder(8, 4)
    out = decode_tiles_2d(latents, decode, tiling, 8)
    assert out.dtype == dtype
    assert torch.equal(out, _blend_all_at_the_end(latents, decode, tiling, 8))


def test_a_decoder_that_changes_the_leading_axes():
    """HunyuanVideo-1.5's tiled encode shape: [B, C, F, s, s, h, w] blocks in, [B, C', F', h, w] out."""
    blocks = torch.randn(1, 3, 2, 2, 2, 9, 7, generator=torch.Generator().manual_seed(5))
    base = _decoder(1, 3)

    def encode(tile: Tensor) -> Tensor:
        return base(tile.flatten(2, 4))[:, :, ::3]

    tiling = SpatialTiling(tile=4, stride=3)
    out = decode_tiles_2d(blocks, encode, tiling, 1)
    assert out.shape == (1, 3, 3, 9, 7)
    assert torch.equal(out, _blend_all_at_the_end(blocks, encode, tiling, 1))


def test_no_decoded_tile_is_alive_when_the_next_decodes():
    live: list[weakref.ref] = []
    latents = torch.randn(1, 2, 3, 10, 14, generator=torch.Generator().manual_seed(2))
    decode_tiles_2d(latents, _decoder(4, 2, live), SpatialTiling(tile=24, stride=16), 4)
    assert len(live) == 3 * 4


def test_a_tile_of_the_wrong_size_is_refused():
    latents = torch.randn(1, 2, 3, 10, 14)
    with pytest.raises(ValueError, match=r"decoded to \(20, 20\), not \(24, 24\)"):
        decode_tiles_2d(latents, lambda tile: _decoder(4, 2)(tile)[..., :-4, :-4], SpatialTiling(24, 16), 4)
