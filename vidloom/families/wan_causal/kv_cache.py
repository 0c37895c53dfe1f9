"""Preallocated per-layer K/V slab for one causal rollout (one request, CFG branches batched), and several
requests' slabs side by side for one batched rollout step (FarKVStack)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from vidloom.families.wan_causal.layout import ChunkLayout


# Compared and hashed by identity: a CUDA graph's signature holds its slab (FarNetwork.graph_split).
@dataclass(eq=False)
class FarKVCache:
    """K and V of the context tokens, per layer, after RoPE: [layers, B, null + capacity, heads, head_dim].

    The first `null` rows are never written and stay zero: they are the null keys a
    generated chunk attends to (see ChunkLayout.null_keys), so reading the cache is a
    slice, never a concatenation. Context tokens follow, then room for the chunk being
    generated, whose K/V each step writes in place. The prefill pass rewrites the
    context from row `null` on (the far context is re-embedded as chunks age).

    Under cuda_graphs the slab is a static buffer (runtime.static_buffers): it passes to the next request of the
    same shape, which starts with `clear_context`; rows past the valid prefix are never read, so stale ones are
    harmless, and the null rows are never written by anyone.

    Under sequence parallel a rank's slab holds its rows of every chunk (parallel.ChunkShards): the row counts
    below are this rank's (`rows` maps a segment's tokens to them; one device keeps them all).
    """

    keys: Tensor
    values: Tensor
    null: int
    context_tokens: int = 0
    """Context tokens currently valid, over every rank (set by the prefill pass)."""
    context_rows: int = 0
    """This slab's rows of them (context_tokens on one device)."""

    @classmethod
    def allocate(
        cls, layouts: list[ChunkLayout], num_layers: int, batch: int, heads: int, head_dim: int,
        device: torch.device, dtype: torch.dtype, rows: Callable[[int], int] = int,
    ) -> FarKVCache:
        """A slab big enough for every chunk of a rollout, given the layout of each chunk."""
        null, capacity = cls.slab_rows(layouts, rows)
        shape = (num_layers, batch, null + capacity, heads, head_dim)
        return cls(
            keys=torch.zeros(shape, device=device, dtype=dtype),
            values=torch.zeros(shape, device=device, dtype=dtype),
            null=null,
        )

    @staticmethod
    def slab_rows(layouts: list[ChunkLayout], rows: Callable[[int], int] = int) -> tuple[int, int]:
        """(null rows, capacity rows) of a slab for these layouts, each segment taking `rows(tokens)` rows."""
        null = max(rows(layout.null_keys) for layout in layouts)
        return null, max(sum(rows(n) for n in layout.chunk_tokens()) for layout in layouts)

    @classmethod
    def bytes_needed(
        cls, layouts: list[ChunkLayout], num_layers: int, batch: int, heads: int, head_dim: int, dtype: torch.dtype,
        rows: Callable[[int], int] = int,
    ) -> int:
        """Bytes `allocate` would take for these layouts (for admission before allocating)."""
        slab = sum(cls.slab_rows(layouts, rows))
        return 2 * num_layers * batch * slab * heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @staticmethod
    def reuse_key(layouts: list[ChunkLayout], num_layers: int, batch: int, heads: int, head_dim: int,
                  device: torch.device, dtype: torch.dtype, rows: Callable[[int], int] = int) -> tuple:
        """What makes two slabs interchangeable (LoopContext.allocate's `reuse`): the shape `allocate` gives these
        layouts, dtype and device."""
        null, capacity = FarKVCache.slab_rows(layouts, rows)
        return ("far-kv", num_layers, batch, null, capacity, heads, head_dim, dtype, str(device))

    def clear_context(self) -> FarKVCache:
        """This slab with no valid context (a static slab taken over from an earlier request)."""
        self.context_tokens = self.context_rows = 0
        return self

    def __repr__(self) -> str:
        # Shapes only: the lockstep record (runtime.parallel.rank) compares plan inputs by repr, and every rank of a
        # sequence-parallel group holds its own rows.
        return (f"FarKVCache(shape={tuple(self.keys.shape)}, null={self.null}, context_tokens={self.context_tokens}, "
                f"context_rows={self.context_rows})")

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    def write(self, layer: int, start: int, k: Tensor, v: Tensor) -> None:
        """Store k/v [B, n, H, D] at context row `start` (0 = first context token) of `layer`."""
        row = self.null + start
        if row + k.shape[1] > self.keys.shape[2]:
            raise ValueError(f"KV cache overflow: rows {row}..{row + k.shape[1]} > {self.keys.shape[2]}")
        self.keys[layer, :, row : row + k.shape[1]] = k
        self.values[layer, :, row : row + v.shape[1]] = v

    def read(self, layer: int, null_keys: int, end: int) -> tuple[Tensor, Tensor]:
        """Views [B, null_keys + end, H, D]: `null_keys` zero rows, then context rows [0, end)."""
        start = self.null - null_keys
        stop = self.null + end
        return self.keys[layer, :, start:stop], self.values[layer, :, start:stop]

    def step_attention(self, layer: int, start: int, null_keys: int, q: Tensor, k: Tensor, v: Tensor,
                       attend: Callable[[Tensor, Tensor, Tensor], Tensor]) -> Tensor:
        """A rollout step's self-attention at `layer`: write the chunk's k/v [B, n, H, D] at context row `start`,
        then `attend(q, keys, values)` over [`null_keys` zero rows, the context, the chunk]."""
        self.write(layer, start, k, v)
        keys, values = self.read(layer, null_keys, start + k.shape[1])
        return attend(q, keys, values)

    def context_copy(self) -> FarKVCache:
        """A compact copy of the valid context rows (no null rows, no room to generate): a session's KV."""
        rows = slice(self.null, self.null + self.context_rows)
        return FarKVCache(self.keys[:, :, rows].clone(), self.values[:, :, rows].clone(), 0, self.context_tokens,
                          self.context_rows)

    def load_context(self, source: FarKVCache) -> None:
        """Take `source`'s context rows (a session's KV) as this slab's prefilled context."""
        rows = source.context_rows
        if self.null + rows > self.keys.shape[2] or source.keys.shape[1] != self.keys.shape[1]:
            raise ValueError(f"session KV of {rows} rows, batch {source.keys.shape[1]} does not fit this slab "
                             f"{tuple(self.keys.shape)}")
        src = slice(source.null, source.null + rows)
        self.keys[:, :, self.null : self.null + rows] = source.keys[:, :, src]
        self.values[:, :, self.null : self.null + rows] = source.values[:, :, src]
        self.context_tokens, self.context_rows = source.context_tokens, rows

    @staticmethod
    def context_bytes(keys: Tensor, rows: int) -> int:
        """Bytes of a `context_copy` of `rows` rows of a slab whose keys are `keys`."""
        layers, batch, _, heads, dim = keys.shape
        return 2 * layers * batch * rows * heads * dim * keys.element_size()


class FarKVStack:
    """Several requests' slabs as one batched rollout step sees them (runtime.batching stacks the requests' steps).

    The step's rows are CFG-branch-major over the requests ([uncond of each, cond of each]; one row each without
    CFG), so request i's rows are every n-th row from row i: a strided view, in its own slab's branch order. Each
    request writes its chunk's K/V into its own slab, and its queries attend to that slab alone: one attention call
    per request inside the shared forward. Concatenating the slabs' K/V for one call instead would copy every layer's
    whole context at every step (the 1.3B checkpoint at 480x832 late in a rollout: ~14k context tokens, ~180 MB of
    bf16 K and V per layer and request with CFG) to save one attention launch per request and layer, a launch over
    thousands of queries; bench/far_batching.py times both. Every slab holds the same context (FarNetwork.batch_key).
    """

    def __init__(self, caches: Sequence[FarKVCache]) -> None:
        self.caches = tuple(caches)

    @property
    def context_tokens(self) -> int:
        return self.caches[0].context_tokens

    @property
    def context_rows(self) -> int:
        return self.caches[0].context_rows

    def step_attention(self, layer: int, start: int, null_keys: int, q: Tensor, k: Tensor, v: Tensor,
                       attend: Callable[[Tensor, Tensor, Tensor], Tensor]) -> Tensor:
        n = len(self.caches)
        outs = [cache.step_attention(layer, start, null_keys, q[i::n], k[i::n], v[i::n], attend)
                for i, cache in enumerate(self.caches)]
        return torch.stack(outs, dim=1).flatten(0, 1)  # [branches, n, ...] -> branch-major rows again
