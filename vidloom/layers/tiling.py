"""Tiled decoding shared by every VAE: the tile grid, the linear cross-fade at seams, and the deploy rule.

Images and video (`decode_tiles_2d`): the latent is cut into overlapping tiles (`tile` cells every `stride`
cells) over its last two axes; each tile is decoded alone and the decoded tiles are put back in raster order,
each cross-faded over the `tile - stride` overlap with the already-blended tile above and to the left, then cut
to `stride`: the rule of diffusers' `tiled_decode` (AutoencoderKL, Flux2, Wan, LTX-2). Audio
(`decode_windows_1d`): windows over time whose overlapping context is decoded and cut away, diffusers' Oobleck
rule. A family whose reference tiles this way agrees with it when configured alike. Each tile blends into the
output as soon as it is decoded, so peak memory follows one tile's decode plus the output and one row of overlap
strips, not the whole latent.
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
    `shared_tiles(group)` the ranks of `group` decode every P-th tile each and exchange them (same result).

    Each tile is blended and written into the output as soon as it is decoded, so a decode holds one tile, the
    output, and what later tiles blend with: the previous row's bottom overlaps (the blended tiles' rows past
    `stride`) and the left neighbour's right overlap (its columns past `stride`), never whole tiles. A blend reads
    only those entries of the tile above or to the left, so the result is the blend-all-at-the-end rule's bit for
    bit (tests/unit/layers/test_tiling_stream.py)."""
    tile, stride = tiling.in_cells(factor)
    height, width = latents.shape[-2:]
    starts = [(i, j) for i in range(0, height, stride) for j in range(0, width, stride)]
    parts = [latents[..., i : i + tile, j : j + tile] for i, j in starts]
    columns = len(range(0, width, stride))
    extent, keep = tiling.tile - tiling.stride, tiling.stride
    out: Tensor | None = None
    above: list[Tensor | None] = [None] * columns  # per column: the blended bottom overlap of the row above
    left: Tensor | None = None  # the blended right overlap of the tile to the left
    tiles = _decoded_tiles(parts, decode, factor)
    for index, ((i, j), part) in enumerate(zip(starts, parts)):
        decoded = next(tiles)  # not through enumerate/zip, whose reused result tuple would keep the previous tile
        c = index % columns
        expected = (part.shape[-2] * factor, part.shape[-1] * factor)
        if tuple(decoded.shape[-2:]) != expected:
            raise ValueError(f"a tile of {tuple(part.shape[-2:])} latent cells decoded to "
                             f"{tuple(decoded.shape[-2:])}, not {expected} (factor {factor})")
        if out is None:
            out = decoded.new_empty((*decoded.shape[:-2], height * factor, width * factor))
        if above[c] is not None:
            decoded = blend(above[c], decoded, extent, dim=-2)
        if left is not None:
            decoded = blend(left, decoded, extent, dim=-1)
        out[..., i * factor : i * factor + keep, j * factor : j * factor + keep] = decoded[..., :keep, :keep]
        # Copies, so the blended tile itself is freed before the next one decodes.
        above[c] = decoded[..., keep:, :].clone() if i + stride < height else None
        left = decoded[..., :, keep:].clone() if j + stride < width else None
        del decoded
    assert out is not None  # a latent has at least one tile
    return out


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


def _decoded_tiles(parts: list[Tensor], decode: Decode, factor: int) -> Iterator[Tensor]:
    """Every latent tile decoded, in order, one at a time. Split over a tile group: in round k rank r decodes tile
    kP + r and the ranks all-gather that round's tiles, padded to the largest tile's shape; each is cut back to its
    own size (its latent extent times `factor` on the tiled axes; the other axes are the same for every tile). The
    exchange copies values, so the result is the one device's bit for bit, and a round holds P tiles, not all."""
    group = _TILE_GROUP.get()
    if group is None or len(parts) < group.size:  # fewer tiles than ranks: each decodes them all
        for part in parts:
            yield decode(part)
        return
    padded_shape: list[int] = []
    like: dict[str, Any] = {}
    for first in range(0, len(parts), group.size):
        index = first + group.rank
        padded = None
        if index < len(parts):  # every rank has a tile in round 0, where the padded shape is set
            mine = decode(parts[index])
            if not padded_shape:
                padded_shape = [*mine.shape[:-2], max(p.shape[-2] for p in parts) * factor,
                                max(p.shape[-1] for p in parts) * factor]
                like = {"dtype": mine.dtype, "device": mine.device}
            padded = mine.new_zeros(padded_shape)
            padded[..., : mine.shape[-2], : mine.shape[-1]] = mine
            del mine
        gathered = group.all_gather(torch.zeros(padded_shape, **like) if padded is None else padded)
        del padded
        for owner, decoded in enumerate(gathered):
            if first + owner < len(parts):
                h, w = (n * factor for n in parts[first + owner].shape[-2:])
                yield decoded[..., :h, :w]
        del gathered, decoded


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
