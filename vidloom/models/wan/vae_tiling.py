"""Spatially tiled Wan VAE decode over the shared tiling rule (vidloom.layers.tiling).

Same tiling and blending rule as diffusers' AutoencoderKLWan.tiled_decode (tiles in raster order, each
blended with the already-blended tile above and to the left), so the two agree when configured alike;
diffusers' LTX-2 video VAE tiles by the same rule (models/ltx2/video_vae.py decodes through this too).
`SpatialTiling` and `deploy_tiling` are re-exported from the shared module.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from vidloom.layers.tiling import SpatialTiling, decode_tiles_2d, deploy_tiling, tiles_here

__all__ = ["SpatialTiling", "TileDecoder", "decode_tiled", "deploy_tiling"]

# decode(tile_latents, frames_done_before, frames_total) -> unclamped pixels
TileDecoder = Callable[[Tensor, int, int], Tensor]


def decode_tiled(latents: Tensor, decode: TileDecoder, tiling: SpatialTiling, factor: int) -> Tensor:
    """Decode [B, z, T, h, w] tile by tile; returns unclamped [B, 3, F, h*factor, w*factor]."""
    tile, stride = tiling.in_cells(factor)
    frames, height, width = latents.shape[2:]
    total = frames * tiles_here(len(range(0, height, stride)) * len(range(0, width, stride)))
    done = 0

    def one(tile_latents: Tensor) -> Tensor:
        nonlocal done
        out = decode(tile_latents, done, total)
        done += frames
        return out

    return decode_tiles_2d(latents, one, tiling, factor)
