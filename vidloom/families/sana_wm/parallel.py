"""SANA-WM under sequence parallel: each rank keeps a band of patch rows of every frame (FrameRows).

Why rows, not the contiguous 1/K of the sequence other DiTs keep: almost everything in a SANA-WM block reads a
token's own frame and position across frames, not the flattened order. With every frame's rows [r*h/K, (r+1)*h/K)
on rank r, the per-frame modulation, the temporal short convolutions (per position, over frames), the norms,
gates, cross-attention, the FFN's 1x1 and temporal convolutions all run on the band as they are. Three things see
beyond it, and exchange:
- self-attention (the gated delta rule sums a frame's tokens into its state; the softmax blocks attend all tokens):
  Ulysses all-to-all to every token x heads/K around the branch kernels (`to_heads` / `to_tokens`), so K must
  divide the self-attention heads (no ring: ring attention is softmax attention);
- the decay gate reads each frame's mean token: the bands' frame sums are all-gathered (`frame_sum`);
- the FFN's depthwise 3x3 convolution reads one row above and below the band: a halo of two rows per rank is
  all-gathered (`halo`), zero rows at the grid's edges as the one-device convolution pads.
The tokens are gathered back into frame order after the output projection.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vidloom.core.parallel import SequenceGeometry, TokenLayout
from vidloom.families.sana_wm.config import SanaWMConfig
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.models.ltx2.checkpoint import read_video_vae_config

if TYPE_CHECKING:  # the runtime's exchanges import torch.distributed (and dynamo): only a sharded run needs them
    from vidloom.runtime.parallel.comm import Comm


def token_layout(checkpoint: Path) -> TokenLayout:
    """Stage 1's video tokens, sharded by patch rows of every frame (each frame's patch rows must divide by K);
    the caption is cross-attention context, whole on every rank. The --two-stage refiner shards over the same
    sp group (refiner_parallel.py; not a `denoisers` entry, its windowed forward is the family's own): each rank
    keeps 1/K of the active chunk's tokens (padded to split) and heads/K of every sink and history token of its
    window; where K does not divide the refiner's heads it runs whole on every rank (logged at load). CFG:
    negative and positive prompt, one per rank (the refiner has no CFG: every CFG rank runs it alike). The prompt
    nodes (--text-encoder-rank): stage 1's Gemma-2 and, with the refiner, its Gemma-3 and connectors."""
    ckpt = DiffusersDir.open(checkpoint)
    dit = SanaWMConfig.from_diffusers(ckpt.component_config("transformer"))
    vae = read_video_vae_config(ckpt.component_dir("vae"))
    grid = SequenceGeometry(num_heads=dit.self_attn_heads, patch_size=tuple(dit.patch_size),
                            vae_spatial=vae.spatial_compression_ratio, vae_temporal=vae.temporal_compression_ratio)
    return TokenLayout(num_heads=dit.self_attn_heads, streams=("video",), split="rows", grid=grid,
                       prompt_nodes=("encode_text", "encode_refiner_text"))


class FrameRows:
    """A sequence layout: rank r of `comm` keeps patch rows [r*h/K, (r+1)*h/K) of every frame, in frame order."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def band(self, grid: tuple[int, int, int]) -> tuple[int, int, int]:
        """This rank's grid (frames, rows, width) of the whole grid."""
        f, h, w = grid
        if h % self.comm.size:
            # Requests are checked at submit (runtime.parallel.plan, split "rows"); this guards direct callers.
            raise ValueError(f"{h} patch rows do not split over sp={self.comm.size} ranks")
        return f, h // self.comm.size, w

    def shard(self, tokens: Tensor, grid: tuple[int, int, int]) -> Tensor:
        """[B, F*h*w, C] -> this rank's band [B, F*(h/K)*w, C]."""
        frames = self.band(grid)[0]
        band = tokens.unflatten(1, (frames, self.comm.size, -1))[:, :, self.comm.rank]
        return band.flatten(1, 2).contiguous()

    def gather(self, tokens: Tensor, frames: int) -> Tensor:
        """Every rank's band [B, F*(h/K)*w, C] -> the whole grid's tokens [B, F*h*w, C] in frame order."""
        bands = self.comm.all_gather(tokens).unflatten(2, (frames, -1))  # [K, B, F, band, C]
        return bands.movedim(0, 2).flatten(1, 3)

    def to_heads(self, x: Tensor, frames: int) -> Tensor:
        """[..., B, F*band, H, D] (my rows, all heads) -> [..., B, F*h*w, H/K, D] (every token in frame order, my
        heads)."""
        from vidloom.runtime.parallel.ulysses import seq_to_heads

        y = seq_to_heads(x, self.comm)  # tokens rank-major: (rank, frame, band position)
        return y.unflatten(-3, (self.comm.size, frames, -1)).transpose(-5, -4).flatten(-5, -3)

    def to_tokens(self, x: Tensor, frames: int) -> Tensor:
        """The inverse of to_heads: [B, F*h*w, H/K, D] -> [B, F*band, H, D]."""
        from vidloom.runtime.parallel.ulysses import heads_to_seq

        y = x.unflatten(-3, (frames, self.comm.size, -1)).transpose(-5, -4).flatten(-5, -3)
        return heads_to_seq(y, self.comm)

    def heads(self, count: int) -> slice:
        """Which of `count` heads this rank attends after to_heads."""
        share = count // self.comm.size
        return slice(self.comm.rank * share, (self.comm.rank + 1) * share)

    def frame_sum(self, x: Tensor) -> Tensor:
        """Per-frame sums over this band [B, F, C] -> the whole frames' sums, added in rank order on every rank."""
        return self.comm.all_gather(x).sum(dim=0)

    def halo(self, x: Tensor) -> Tensor:
        """[N, C, band, w] -> [N, C, band + 2, w]: the row above and below from the neighbouring bands, zeros at the
        grid's top and bottom edges (what a padding-1 convolution over the whole grid reads there)."""
        edges = self.comm.all_gather(torch.stack((x[:, :, :1], x[:, :, -1:])))  # [K, 2, N, C, 1, w]
        rank, zeros = self.comm.rank, torch.zeros_like(x[:, :, :1])
        above = edges[rank - 1, 1] if rank > 0 else zeros
        below = edges[rank + 1, 0] if rank + 1 < self.comm.size else zeros
        return torch.cat((above, x, below), dim=2)
