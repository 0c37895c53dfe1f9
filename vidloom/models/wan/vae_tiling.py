"""Spatially tiled VAE decode: overlapping tiles decoded one at a time, seams blended linearly.

Same tiling and blending rule as diffusers' AutoencoderKLWan.tiled_decode (tiles in
raster order, each blended with the already-blended tile above and to the left), so
the two agree when configured alike; diffusers' LTX-2 video VAE tiles by the same rule
(models/ltx2/video_vae.py decodes through this too). `deploy_tiling` turns the deployment's
`vae_tile` options into a SpatialTiling for any family whose VAE decodes this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError

# decode(tile_latents, frames_done_before, frames_total) -> unclamped pixels
TileDecoder = Callable[[Tensor, int, int], Tensor]


@dataclass(frozen=True)
class SpatialTiling:
    """Tile geometry in pixels (diffusers' defaults: 256-pixel tiles every 192 pixels)."""

    tile: int = 256
    """Tile height and width in pixels; a multiple of the VAE's spatial factor."""
    stride: int = 192
    """Pixels between tile starts; the `tile - stride` overlap is blended."""

    def __post_init__(self) -> None:
        if not 0 < self.stride <= self.tile:
            raise ValueError(f"tiling needs 0 < stride <= tile, got stride={self.stride}, tile={self.tile}")


def deploy_tiling(deploy: DeployConfig, factor: int) -> SpatialTiling | None:
    """The deployment's tiles (None: untiled); checked at load, so a bad tile size never fails a request at
    decode time. `factor`: the VAE's pixels per latent cell; the default stride is 3/4 of the tile."""
    if deploy.vae_tile is None:
        return None
    stride = deploy.vae_tile_stride or max(factor, deploy.vae_tile * 3 // 4 // factor * factor)
    if deploy.vae_tile % factor or stride % factor:
        raise DeployError(f"vae_tile ({deploy.vae_tile}) and vae_tile_stride ({stride}) must be multiples of {factor}")
    return SpatialTiling(tile=deploy.vae_tile, stride=stride)


def decode_tiled(latents: Tensor, decode: TileDecoder, tiling: SpatialTiling, factor: int) -> Tensor:
    """Decode [B, z, T, h, w] tile by tile; returns unclamped [B, 3, F, h*factor, w*factor]."""
    if tiling.tile % factor or tiling.stride % factor:
        raise ValueError(f"tile ({tiling.tile}) and stride ({tiling.stride}) must be multiples of {factor}")
    _, _, frames, height, width = latents.shape
    tile, stride = tiling.tile // factor, tiling.stride // factor
    starts_h, starts_w = range(0, height, stride), range(0, width, stride)
    total = frames * len(starts_h) * len(starts_w)
    rows: list[list[Tensor]] = []
    done = 0
    for i in starts_h:
        row = []
        for j in starts_w:
            row.append(decode(latents[:, :, :, i : i + tile, j : j + tile], done, total))
            done += frames
        rows.append(row)
    blend = tiling.tile - tiling.stride
    out_rows = []
    for r, row in enumerate(rows):
        for c in range(len(row)):
            if r > 0:
                row[c] = _blend(rows[r - 1][c], row[c], blend, dim=-2)
            if c > 0:
                row[c] = _blend(row[c - 1], row[c], blend, dim=-1)
        out_rows.append(torch.cat([t[..., : tiling.stride, : tiling.stride] for t in row], dim=-1))
    return torch.cat(out_rows, dim=-2)[..., : height * factor, : width * factor]


def _blend(before: Tensor, tile: Tensor, extent: int, dim: int) -> Tensor:
    """Cross-fade the first `extent` pixels of `tile` from the last ones of `before` along `dim`."""
    extent = min(before.shape[dim], tile.shape[dim], extent)
    if extent == 0:
        return tile
    # Weights in float64 then rounded once, like a per-row Python-float loop would.
    ramp = torch.arange(extent, dtype=torch.float64) / extent
    shape = [1] * tile.ndim
    shape[dim] = extent
    take = ramp.view(shape).to(tile.device, tile.dtype)
    keep = (1 - ramp).view(shape).to(tile.device, tile.dtype)
    head = before.narrow(dim, before.shape[dim] - extent, extent) * keep + tile.narrow(dim, 0, extent) * take
    return torch.cat([head, tile.narrow(dim, extent, tile.shape[dim] - extent)], dim=dim)
