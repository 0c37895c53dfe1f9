"""One sequence's K/V in a contiguous buffer [layers, 2, capacity, kv_heads, head_dim] (a KVAttention).

The reasoner's decode writes its prompt and tokens here step by step; the buffer has the same layout
as a generation prefix, and comes from the runtime's cache manager like one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vidloom.models.cosmos3.transformer import grouped_attention


class BufferKV:
    """Appends a forward's K/V at `start` and attends each new token causally to everything before it."""

    def __init__(self, buffer: Tensor, start: int, scale: float) -> None:
        self.buffer, self.start, self.scale = buffer, start, scale

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        n = k.shape[0]
        end = self.start + n
        if end > self.buffer.shape[2]:
            raise RuntimeError(f"KV buffer holds {self.buffer.shape[2]} tokens, the sequence needs {end}")
        self.buffer[layer, 0, self.start:end] = k
        self.buffer[layer, 1, self.start:end] = v
        keys, values = self.buffer[layer, 0, :end], self.buffer[layer, 1, :end]
        rows = torch.arange(self.start, end, device=q.device)[:, None]
        mask = torch.arange(end, device=q.device)[None, :] <= rows
        return grouped_attention(q, keys, values, self.scale, mask=mask)
