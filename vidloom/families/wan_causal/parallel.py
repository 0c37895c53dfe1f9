"""AnyFlow-FAR under sequence parallel: every chunk's tokens, and so every chunk's KV, split across the ranks.

FAR attends block-causally (chunk i's queries see chunks [0, i]) and keeps the context chunks' K/V in a slab between
steps. Rank r keeps rows [r * n/K, (r + 1) * n/K) of every chunk of n tokens (each chunk padded at its end to a
multiple of K), in chunk order: its rows of chunks [0, i] are then a prefix of its rows, so a chunk's keys are one
slice on every rank, as on one device, and the slab a prefill writes holds each rank's rows of every context chunk
(its shard of the history KV). Each attention (a prefill chunk over its prefix, a step's chunk over [null keys,
history, itself]) passes its rank's queries, keys and a key mask in rank order (`key_mask`: the pad rows of every
segment are no keys) to the layer's attention, which sequence parallel wraps in Ulysses or ring attention
(runtime.parallel.ulysses.apply_sp). Softmax attention does not depend on the order of its keys, so keys gathered in
rank order (each rank's rows of every chunk) give one device's result up to summation order. The reference's null
keys (ChunkLayout.null_keys, all-zero) are one more segment, split the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vidloom.core.parallel import TokenLayout
from vidloom.families.wan_causal.config import FarTransformerConfig
from vidloom.loading.diffusers_dir import DiffusersDir

if TYPE_CHECKING:  # the runtime's exchanges import torch.distributed: only a sharded run needs them
    from vidloom.runtime.parallel.comm import Comm


def token_layout(checkpoint: Path) -> TokenLayout:
    """Every chunk's tokens (compressed far context, full context, the chunk being generated) and their KV, sharded
    per chunk and padded where a chunk does not split; the text is cross-attention context, whole on every rank.
    Classic two-branch CFG: under --cfg-parallel each rank runs (and keeps the KV of) one branch."""
    dit = DiffusersDir.open(checkpoint).parse_component("transformer", FarTransformerConfig.from_diffusers)
    return TokenLayout(num_heads=dit.wan.num_attention_heads, streams=("history_kv", "video"), split="pad")


class WholeChunks:
    """Every token on this device: a segment's rows are all of it, nothing is padded."""

    def rows(self, length: int) -> int:
        """This rank's rows of a segment of `length` tokens."""
        return length

    def take(self, x: Tensor, lengths: list[int], dim: int = 1) -> Tensor:
        """This rank's rows of each segment of x (segments of `lengths` along `dim`), in segment order."""
        return x

    def gather(self, x: Tensor, length: int) -> Tensor:
        """One segment's tokens [B, length, D] from every rank's rows [B, rows(length), D]."""
        return x

    def key_mask(self, lengths: list[int]) -> Tensor | None:
        """Keys made of this rank's rows of each segment, gathered in rank order: which are real (None: all)."""
        return None


WHOLE_CHUNKS = WholeChunks()


class ChunkShards(WholeChunks):
    """Rank r of `comm` keeps rows [r * m, (r + 1) * m) of each segment, m = ceil(length / K), zeros past its end."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def rows(self, length: int) -> int:
        return -(-length // self.comm.size)

    def take(self, x: Tensor, lengths: list[int], dim: int = 1) -> Tensor:
        parts, start = [], 0
        for length in lengths:
            rows = self.rows(length)
            first = min(self.comm.rank * rows, length)
            part = x.narrow(dim, start + first, min(rows, length - first))
            if part.shape[dim] < rows:  # this rank's share runs past the segment: zero rows, masked as keys
                shape = list(part.shape)
                shape[dim] = rows - part.shape[dim]
                part = torch.cat([part, part.new_zeros(shape)], dim=dim)
            parts.append(part)
            start += length
        return torch.cat(parts, dim=dim)

    def gather(self, x: Tensor, length: int) -> Tensor:
        gathered = self.comm.all_gather(x.contiguous())  # [K, B, rows, D]
        return gathered.movedim(0, 1).flatten(1, 2)[:, :length]

    def key_mask(self, lengths: list[int]) -> Tensor | None:
        rank_rows = [torch.arange(self.rows(n)) + r * self.rows(n) < n for r in range(self.comm.size) for n in lengths]
        mask = torch.cat(rank_rows)
        return None if bool(mask.all()) else mask
