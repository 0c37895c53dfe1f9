"""Preallocated per-layer K/V slab for one causal rollout (one request, CFG branches batched)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vidloom.families.wan_causal.layout import ChunkLayout


@dataclass
class FarKVCache:
    """K and V of the context tokens, per layer, after RoPE: [layers, B, null + capacity, heads, head_dim].

    The first `null` rows are never written and stay zero: they are the null keys a
    generated chunk attends to (see ChunkLayout.null_keys), so reading the cache is a
    slice, never a concatenation. Context tokens follow, then room for the chunk being
    generated, whose K/V each step writes in place. The prefill pass rewrites the
    context from row `null` on (the far context is re-embedded as chunks age).
    """

    keys: Tensor
    values: Tensor
    null: int
    context_tokens: int = 0
    """Context rows currently valid (set by the prefill pass)."""

    @classmethod
    def allocate(
        cls, layouts: list[ChunkLayout], num_layers: int, batch: int, heads: int, head_dim: int,
        device: torch.device, dtype: torch.dtype,
    ) -> FarKVCache:
        """A slab big enough for every chunk of a rollout, given the layout of each chunk."""
        null = max(layout.null_keys for layout in layouts)
        capacity = max(layout.total_tokens for layout in layouts)
        shape = (num_layers, batch, null + capacity, heads, head_dim)
        return cls(
            keys=torch.zeros(shape, device=device, dtype=dtype),
            values=torch.zeros(shape, device=device, dtype=dtype),
            null=null,
        )

    @staticmethod
    def bytes_needed(
        layouts: list[ChunkLayout], num_layers: int, batch: int, heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes `allocate` would take for these layouts (for admission before allocating)."""
        rows = max(layout.null_keys for layout in layouts) + max(layout.total_tokens for layout in layouts)
        return 2 * num_layers * batch * rows * heads * head_dim * torch.empty((), dtype=dtype).element_size()

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

    def context_copy(self) -> FarKVCache:
        """A compact copy of the valid context rows (no null rows, no room to generate): a session's KV."""
        rows = slice(self.null, self.null + self.context_tokens)
        return FarKVCache(self.keys[:, :, rows].clone(), self.values[:, :, rows].clone(), 0, self.context_tokens)

    def load_context(self, source: FarKVCache) -> None:
        """Take `source`'s context rows (a session's KV) as this slab's prefilled context."""
        rows = source.context_tokens
        if self.null + rows > self.keys.shape[2] or source.keys.shape[1] != self.keys.shape[1]:
            raise ValueError(f"session KV of {rows} rows, batch {source.keys.shape[1]} does not fit this slab "
                             f"{tuple(self.keys.shape)}")
        src = slice(source.null, source.null + rows)
        self.keys[:, :, self.null : self.null + rows] = source.keys[:, :, src]
        self.values[:, :, self.null : self.null + rows] = source.values[:, :, src]
        self.context_tokens = rows

    @staticmethod
    def context_bytes(keys: Tensor, rows: int) -> int:
        """Bytes of a `context_copy` of `rows` rows of a slab whose keys are `keys`."""
        layers, batch, _, heads, dim = keys.shape
        return 2 * layers * batch * rows * heads * dim * keys.element_size()
