"""Tiled decoding shared by every VAE: the tile grid, the linear cross-fade at seams, and the deploy rule.

Images and video (`decode_tiles_2d`): the latent is cut into overlapping tiles (`tile` cells every `stride`
cells) over its last two axes; each tile is decoded alone and the decoded tiles are put back in raster order,
each cross-faded over the `tile - stride` overlap with the already-blended tile above and to the left, then cut
to `stride`: the rule of diffusers' `tiled_decode` (AutoencoderKL, Flux2, Wan, LTX-2). Audio
(`decode_windows_1d`): windows over time whose overlapping context is decoded and cut away, diffusers' Oobleck
rule. A family whose reference tiles this way agrees with it when configured alike. Peak activation memory
then follows the tile, not the whole latent.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError

# decode(latent_tile) -> decoded tile (unclamped); each output cell covers `factor` cells per tiled axis.
Decode = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class SpatialTiling:
    """Tile geometry in output units (pixels; audio: samples). Default: diffusers' 256 every 192."""

    tile: int = 256
    """Tile length per tiled axis in output units; a multiple of the VAE's factor."""
    stride: int = 192
    """Output units between tile starts; the `tile - stride` overlap is blended."""

    def __post_init__(self) -> None:
        if not 0 < self.stride <= self.tile:
            raise ValueError(f"tiling needs 0 < stride <= tile, got stride={self.stride}, tile={self.tile}")

    def in_cells(self, factor: int) -> tuple[int, int]:
        """(tile, stride) in latent cells of a VAE that decodes one cell to `factor` output units."""
        if self.tile % factor or self.stride % factor:
            raise ValueError(f"tile ({self.tile}) and stride ({self.stride}) must be multiples of {factor}")
        return self.tile // factor, self.stride // factor


def deploy_tiling(deploy: DeployConfig, factor: int, unit: str = "pixels") -> SpatialTiling | None:
    """The deployment's tiles (`vae_tile`, `vae_tile_stride`; None: untiled), checked at load so a bad size
    never fails a request at decode time. `factor`: the VAE's output units (`unit`) per latent cell; the
    default stride is 3/4 of the tile, rounded down to a multiple of `factor`."""
    if deploy.vae_tile is None:
        return None
    stride = deploy.vae_tile_stride or max(factor, deploy.vae_tile * 3 // 4 // factor * factor)
    if deploy.vae_tile % factor or stride % factor:
        raise DeployError(f"vae_tile ({deploy.vae_tile}) and vae_tile_stride ({stride}) must be multiples of "
                          f"{factor} ({unit} per latent cell of this VAE)")
    if stride > deploy.vae_tile:
        raise DeployError(f"vae_tile_stride ({stride}) must not exceed vae_tile ({deploy.vae_tile})")
    return SpatialTiling(tile=deploy.vae_tile, stride=stride)


def decode_tiles_2d(latents: Tensor, decode: Decode, tiling: SpatialTiling, factor: int) -> Tensor:
    """Decode [..., h, w] in overlapping tiles over its last two axes; returns [..., h*factor, w*factor]. Inside
    `shared_tiles(group)` the ranks of `group` decode every P-th tile each and exchange them (same result)."""
    tile, stride = tiling.in_cells(factor)
    height, width = latents.shape[-2:]
    starts = [(i, j) for i in range(0, height, stride) for j in range(0, width, stride)]
    tiles = _decode_all([latents[..., i : i + tile, j : j + tile] for i, j in starts], decode, factor)
    columns = len(range(0, width, stride))
    rows = [tiles[r : r + columns] for r in range(0, len(tiles), columns)]
    extent, keep = tiling.tile - tiling.stride, tiling.stride
    for r, row in enumerate(rows):
        for c in range(len(row)):
            if r > 0:
                row[c] = blend(rows[r - 1][c], row[c], extent, dim=-2)
            if c > 0:
                row[c] = blend(row[c - 1], row[c], extent, dim=-1)
    out = torch.cat([torch.cat([t[..., :keep, :keep] for t in row], dim=-1) for row in rows], dim=-2)
    return out[..., : height * factor, : width * factor]


_TILE_GROUP: contextvars.ContextVar[Any] = contextvars.ContextVar("tile_group", default=None)


@contextlib.contextmanager
def shared_tiles(group: Any) -> Iterator[None]:
    """Tiled decodes in this context split their tiles over `group` (a Comm of ranks holding the same latents:
    every rank of a parallel plan); None: this device decodes every tile."""
    token = _TILE_GROUP.set(group)
    try:
        yield
    finally:
        _TILE_GROUP.reset(token)


def tiles_here(count: int) -> int:
    """How many of `count` tiles this device decodes (all of them unless a tile group splits them): what a
    decode's progress counts to."""
    group = _TILE_GROUP.get()
    return count if group is None or count < group.size else len(range(group.rank, count, group.size))


def _decode_all(parts: list[Tensor], decode: Decode, factor: int) -> list[Tensor]:
    """Every latent tile decoded, in order. Split over a tile group: rank r decodes tiles r, r + P, ...; round k
    all-gathers each rank's k-th tile, padded to the largest tile's shape, and each is cut back to its own size
    (its latent extent times `factor` on the tiled axes; the other axes are the same for every tile). The
    exchange copies values, so the result is the one device's bit for bit."""
    group = _TILE_GROUP.get()
    if group is None or len(parts) < group.size:  # fewer tiles than ranks: each decodes them all
        return [decode(part) for part in parts]
    mine = [decode(part) for part in parts[group.rank :: group.size]]
    full = list(mine[0].shape)
    full[-2:] = [max(p.shape[-2] for p in parts) * factor, max(p.shape[-1] for p in parts) * factor]
    out: list[Tensor] = []
    for k in range(-(-len(parts) // group.size)):
        padded = mine[0].new_zeros(full)
        if k < len(mine):
            padded[..., : mine[k].shape[-2], : mine[k].shape[-1]] = mine[k]
        for owner, decoded in enumerate(group.all_gather(padded)):
            index = k * group.size + owner
            if index < len(parts):
                h, w = (n * factor for n in parts[index].shape[-2:])
                out.append(decoded[..., :h, :w])
    return out


def decode_windows_1d(latents: Tensor, decode: Decode, tiling: SpatialTiling, factor: int) -> Tensor:
    """Decode [..., t] over its last axis in windows: each `stride`-cell core is decoded with up to
    `(tile - stride) / 2` cells of context on each side, and the context's output is cut away again, so tiles
    abut without a blend. This is diffusers' AutoencoderOobleck._tiled_decode (chunk = tile, overlap per side =
    (tile - stride) / 2); an odd difference puts the extra cell on the right. Returns [..., t*factor]."""
    tile, stride = tiling.in_cells(factor)
    length = latents.shape[-1]
    if length <= tile:
        return decode(latents)  # as the reference: no tiles for a latent within one tile
    left = (tile - stride) // 2
    right = tile - stride - left
    pieces = []
    for core in range(0, length, stride):
        start, stop = max(0, core - left), min(length, core + stride + right)
        out = decode(latents[..., start:stop])
        head, tail = (core - start) * factor, (stop - min(core + stride, length)) * factor
        pieces.append(out[..., head : out.shape[-1] - tail])
    return torch.cat(pieces, dim=-1)


def blend(before: Tensor, tile: Tensor, extent: int, dim: int) -> Tensor:
    """Cross-fade the first `extent` entries of `tile` from the last ones of `before` along `dim`."""
    extent = min(before.shape[dim], tile.shape[dim], extent)
    if extent == 0:
        return tile
    # Weights in float64 then rounded once, like the reference's per-row Python-float loop.
    ramp = torch.arange(extent, dtype=torch.float64) / extent
    shape = [1] * tile.ndim
    shape[dim] = extent
    take = ramp.view(shape).to(tile.device, tile.dtype)
    keep = (1 - ramp).view(shape).to(tile.device, tile.dtype)
    head = before.narrow(dim, before.shape[dim] - extent, extent) * keep + tile.narrow(dim, 0, extent) * take
    return torch.cat([head, tile.narrow(dim, extent, tile.shape[dim] - extent)], dim=dim)
