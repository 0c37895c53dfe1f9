"""Paged KV cache for AR decode: fixed-size blocks from one preallocated pool, a block table per sequence.

After vLLM's block manager and nano-vllm's BlockManager: a free list of block ids, a table per
sequence. Blocks for a sequence's whole budget (prompt + max_tokens) are reserved at admission, so a
sequence admitted never fails mid-decode for want of cache; they return to the free list when it
finishes, fails or is cancelled. The pool's bytes are one allocation in the engine's CacheManager.

`BlockAllocator` is pure bookkeeping (no torch); `PagedKVPool` holds the tensors and builds a
`PagedBatch` per forward, which is the model's KV store (a KVAttention: `attend(layer, q, k, v)`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from vidloom.core.errors import CacheBudgetExceeded, KVPoolBusy
from vidloom.layers.grouped_attention import grouped_attention

BLOCK_SIZE = 16  # tokens per block (vLLM's default on GPU)


def blocks_for(tokens: int, block_size: int = BLOCK_SIZE) -> int:
    return -(-tokens // block_size)


class BlockAllocator:
    """Block ids of one pool: a free list and a table per sequence. Thread-safe."""

    def __init__(self, num_blocks: int, block_size: int = BLOCK_SIZE) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._tables: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def reserve(self, seq_id: str, tokens: int) -> list[int]:
        """Blocks for `tokens` tokens of a new sequence. CacheBudgetExceeded (with the numbers) if they do not fit:
        KVPoolBusy, its subclass, when they would fit the empty pool (other sequences hold the blocks now)."""
        need = blocks_for(tokens, self.block_size)
        with self._lock:
            if seq_id in self._tables:
                raise ValueError(f"sequence {seq_id} already holds blocks")
            if need > len(self._free):
                in_use = self.num_blocks - len(self._free)
                error = KVPoolBusy if need <= self.num_blocks else CacheBudgetExceeded
                raise error(need, in_use, self.num_blocks, reason=(
                    f"the request needs {tokens} tokens of KV cache (prompt + max_tokens, {need} blocks of "
                    f"{self.block_size}) but only {len(self._free)} of kv_pool_tokens="
                    f"{self.num_blocks * self.block_size} tokens' {self.num_blocks} blocks are free ({in_use} held "
                    "by running sequences); retry later, ask for fewer max_tokens or raise --kv-pool-tokens"))
            table = [self._free.pop() for _ in range(need)]
            self._tables[seq_id] = table
            return list(table)

    def release(self, seq_id: str) -> int:
        """Return the sequence's blocks to the free list; how many (0 if it held none)."""
        with self._lock:
            table = self._tables.pop(seq_id, None)
            if table is None:
                return 0
            self._free.extend(reversed(table))
            return len(table)

    def table(self, seq_id: str) -> list[int]:
        with self._lock:
            return list(self._tables[seq_id])

    @property
    def blocks_free(self) -> int:
        with self._lock:
            return len(self._free)

    @property
    def blocks_in_use(self) -> int:
        return self.num_blocks - self.blocks_free


@dataclass(frozen=True)
class KVLayout:
    """Shape of one pool: per layer, per block, per token slot, kv heads x head_dim."""

    num_layers: int
    kv_heads: int
    head_dim: int
    num_blocks: int
    block_size: int = BLOCK_SIZE
    scratch_blocks: int = 0
    """Blocks stored past the allocator's `num_blocks`, never handed to a sequence: the padding rows of a captured
    decode graph (runtime.decode_graphs) write their keys and values there."""

    def nbytes(self, dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        blocks = self.num_blocks + self.scratch_blocks
        return 2 * self.num_layers * blocks * self.block_size * self.kv_heads * self.head_dim * element


class PagedKVPool:
    """The pool's K and V tensors [layers, blocks * block_size, kv_heads, head_dim] and their allocator."""

    def __init__(self, layout: KVLayout, device: torch.device, dtype: torch.dtype) -> None:
        blocks = layout.num_blocks + layout.scratch_blocks
        shape = (layout.num_layers, blocks * layout.block_size, layout.kv_heads, layout.head_dim)
        self.layout = layout
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.allocator = BlockAllocator(layout.num_blocks, layout.block_size)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    @property
    def scratch_block(self) -> int | None:
        """The id of the first block no sequence holds (None: the layout has none)."""
        return self.layout.num_blocks if self.layout.scratch_blocks else None

    def batch(self, spans: Sequence[tuple[str, int, int]], scale: float) -> PagedBatch:
        """The KV store of one forward over packed tokens: (seq_id, tokens already cached, new tokens) per sequence,
        in packing order."""
        return PagedBatch(self, [(self.allocator.table(s), start, count) for s, start, count in spans], scale)


class PagedBatch:
    """One forward's view of the pool: writes each new token's k/v to its slot, attends through block tables.

    Index tensors are built once per forward and reused by every layer. Sequences are padded to the
    longest (queries and keys) inside attention only; the packed token layout outside stays unpadded.
    """

    def __init__(self, pool: PagedKVPool, spans: Sequence[tuple[list[int], int, int]], scale: float) -> None:
        self.pool, self.scale = pool, scale
        device, bs = pool.k.device, pool.layout.block_size
        for table, start, count in spans:
            if blocks_for(start + count, bs) > len(table):
                raise ValueError(f"sequence outgrew its {len(table)} reserved blocks ({start + count} tokens)")
        starts = torch.tensor([start for _, start, _ in spans], device=device)
        counts = torch.tensor([count for _, _, count in spans], device=device)
        widest = max(len(table) for table, _, _ in spans)
        tables = torch.tensor([table + [0] * (widest - len(table)) for table, _, _ in spans], device=device)
        # Padded lengths from the host-side spans: no device->host sync.
        longest_q = max(count for _, _, count in spans)
        longest_k = max(start + count for _, start, count in spans)
        # Key slots [B, Lk]: position p of sequence b lives in block tables[b, p // bs] at offset p % bs.
        key_pos = torch.arange(longest_k, device=device).unsqueeze(0)
        block_of = torch.clamp(key_pos // bs, max=widest - 1).expand(len(spans), -1)
        self.key_slots = tables.gather(1, block_of) * bs + key_pos % bs
        self._key_flat = self.key_slots.reshape(-1)  # index_select on the flat pool: ~5x faster than [B, Lk] indexing
        # Queries [B, Lq]: the sequence's new tokens, at absolute positions start .. start + count - 1.
        q_idx = torch.arange(longest_q, device=device).unsqueeze(0)
        self.unpad = q_idx < counts.unsqueeze(1)  # which padded rows are real tokens
        offsets = torch.cumsum(counts, 0) - counts
        self.query_index = torch.where(self.unpad, offsets.unsqueeze(1) + q_idx, 0)  # into the packed tokens
        # Decode (one new token per sequence) packs exactly like [B, 1]: no per-layer gather or unpad. Otherwise
        # the real rows of the flattened [B * Lq] are found once here, not by a boolean index (a sync) per layer.
        self._packed_rows = None if longest_q == 1 else self.unpad.reshape(-1).nonzero().squeeze(1)
        new_slots = self.key_slots.gather(1, (starts.unsqueeze(1) + q_idx).clamp(max=longest_k - 1)).reshape(-1)
        self.slots = new_slots if self._packed_rows is None else new_slots.index_select(0, self._packed_rows)
        # Causal (which also hides key padding past each sequence's end); padded query rows see key 0 only.
        visible = key_pos.unsqueeze(1) <= (starts.unsqueeze(1) + q_idx).unsqueeze(2)
        self.mask = (visible & self.unpad.unsqueeze(2)) | (key_pos == 0).unsqueeze(1)  # [B, Lq, Lk]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k_cache, v_cache = self.pool.k[layer], self.pool.v[layer]
        k_cache.index_copy_(0, self.slots, k.to(k_cache.dtype))
        v_cache.index_copy_(0, self.slots, v.to(v_cache.dtype))
        shape = (*self.key_slots.shape, *k_cache.shape[1:])  # [B, Lk, KVH, D]
        keys = k_cache.index_select(0, self._key_flat).view(shape)
        values = v_cache.index_select(0, self._key_flat).view(shape)
        if self._packed_rows is None:
            queries = q.unsqueeze(1)  # [B, 1, H, D]
        else:
            queries = q.index_select(0, self.query_index.reshape(-1)).view(*self.query_index.shape, *q.shape[1:])
        out = grouped_attention(queries, keys.to(q.dtype), values.to(q.dtype), self.scale, mask=self.mask)
        if self._packed_rows is None:
            return out.squeeze(1)
        return out.reshape(-1, *out.shape[2:]).index_select(0, self._packed_rows)  # packed [T, H, D], packing order


class DecodeKV(PagedBatch):
    """A decode forward's view of the pool built from device tensors alone (one new token per row): what a captured
    decode graph runs (runtime.decode_graphs), the decode case of PagedBatch with every shape fixed by the inputs'.

    `tables` [B, W] block ids (past a row's own blocks: the scratch block), `starts` [B] each row's new token's
    position. Keys are gathered over all W blocks and masked past each row's new token, so nothing is sized by a
    value (no host read); the masked keys add exact zeros to the softmax, so a row equals its PagedBatch decode.
    """

    fixed_shapes = True
    """What a decoder's layers read (KVAttention): this forward is captured, so they too must take paths whose shapes
    follow their inputs' and read nothing on the host (Qwen3-Omni's MoE dispatch)."""

    def __init__(self, pool: PagedKVPool, tables: Tensor, starts: Tensor, scale: float) -> None:
        self.pool, self.scale = pool, scale
        rows, width = tables.shape
        bs = pool.layout.block_size
        key_pos = torch.arange(width * bs, device=tables.device)
        # Key slots [B, W * bs]: block tables[b, p // bs] at offset p % bs (expand, not repeat_interleave: no sync).
        self.key_slots = tables.unsqueeze(2).expand(rows, width, bs).reshape(rows, width * bs) * bs + key_pos % bs
        self._key_flat = self.key_slots.reshape(-1)
        self._packed_rows = None  # one query per row: PagedBatch.attend's [B, 1] path
        self.slots = self.key_slots.gather(1, starts.unsqueeze(1)).squeeze(1)
        self.mask = (key_pos.unsqueeze(0) <= starts.unsqueeze(1)).unsqueeze(1)  # [B, 1, Lk]


class ContiguousKV:
    """Reference KV store: one growing K/V tensor per layer for a single sequence (tests compare paged to it)."""

    def __init__(self, num_layers: int, scale: float) -> None:
        self.scale = scale
        self.k: list[Tensor | None] = [None] * num_layers
        self.v: list[Tensor | None] = [None] * num_layers

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        past_k, past_v = self.k[layer], self.v[layer]
        start = 0 if past_k is None else past_k.shape[0]
        self.k[layer] = k if past_k is None else torch.cat([past_k, k])
        self.v[layer] = v if past_v is None else torch.cat([past_v, v])
        keys, values = self.k[layer], self.v[layer]
        mask = torch.arange(keys.shape[0], device=q.device)[None] <= (torch.arange(q.shape[0], device=q.device) + start)[:, None]
        return grouped_attention(q, keys, values, self.scale, mask=mask)
