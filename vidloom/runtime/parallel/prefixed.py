"""Sequence parallel for generated tokens that attend to a replicated prefix (Cosmos3's cached text K/V) and to
each other.

The generated stream is sharded like any other (ulysses.TokenShards: 1/P of its rows per rank, padded at its end
to split); the prefix's per-layer K/V stay whole on every rank. Every generated query must see every prefix key and
every generated key:

- Ulysses (P divides the query heads): the queries and the generated keys/values go to head shards (all rows, H/P
  heads), each rank attends to its heads' slice of the prefix plus all generated keys, and the output comes back.
  Grouped-query K/V whose head count P does not divide are repeated to the query heads first (more traffic, same
  result).
- Ring (any head count): each rank attends its queries to the whole prefix, then to every rank's generated block as
  it passes around the ring, merged by log-sum-exp (ring.py).

The prefix never enters an exchange: it is the same on every rank, so attending to it locally is exact and free of
traffic. Softmax scale: 1/sqrt(head_dim), as Cosmos3's backbone attends.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import Tensor

from vidloom.layers.grouped_attention import grouped_attention
from vidloom.runtime.parallel.comm import Comm
from vidloom.runtime.parallel.ring import QUERY_CHUNK, _key_blocks, _merge
from vidloom.runtime.parallel.ulysses import _real_tokens, heads_to_seq, seq_to_heads


class PrefixedAttentionFn(Protocol):
    """q [S, H, Dh], k, v [S, KVH, Dh] (the generated rows), prefix_k, prefix_v [L, KVH, Dh] -> [S, H, Dh]: the
    generated queries over [prefix keys | generated keys]. `mask`: None, or the generated stream's pad mask [S]
    (CPU bool, JointPart.key_mask) when it was padded to split."""

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor,
                 mask: Tensor | None = None) -> Tensor: ...


class PrefixedLayer(Protocol):
    """What apply_sp wraps (a model's `prefixed_attentions()`)."""

    num_heads: int
    kv_heads: int
    attention_fn: PrefixedAttentionFn


class PrefixedUlysses:
    """PrefixedAttentionFn over a sharded generated stream, by head shards (P divides the query heads)."""

    def __init__(self, comm: Comm, num_heads: int, kv_heads: int) -> None:
        if num_heads % comm.size:
            raise ValueError(f"{num_heads} heads do not split over {comm.size} ranks")
        self.comm = comm
        # Grouped K/V whose heads do not split are repeated to the query heads (query head h reads kv head h // g).
        self.repeat = 1 if kv_heads % comm.size == 0 else num_heads // kv_heads

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor,
                 mask: Tensor | None = None) -> Tensor:
        if self.repeat > 1:
            k, v, prefix_k, prefix_v = (t.repeat_interleave(self.repeat, dim=-2) for t in (k, v, prefix_k, prefix_v))
        p, r = self.comm.size, self.comm.rank
        q = seq_to_heads(q, self.comm)  # [S, H/P, Dh]
        kv = seq_to_heads(torch.stack((k, v)), self.comm)  # [2, S, KVH/P, Dh]
        padded = q.shape[0]
        real = padded if mask is None else _real_tokens(mask, padded)
        group = prefix_k.shape[-2] // p
        mine = slice(r * group, (r + 1) * group)  # this rank's kv heads of the replicated prefix
        keys = torch.cat([prefix_k[:, mine], kv[0, :real]])
        values = torch.cat([prefix_v[:, mine], kv[1, :real]])
        out = grouped_attention(q[:real], keys, values, q.shape[-1] ** -0.5)
        if real < padded:  # the pad rows' outputs: zeros, cut off before the head
            out = torch.cat([out, out.new_zeros((padded - real, *out.shape[1:]))])
        return heads_to_seq(out, self.comm)


class PrefixedRing:
    """PrefixedAttentionFn over a sharded generated stream, any head count: the prefix attended locally, the
    generated K/V passed around the ring."""

    def __init__(self, comm: Comm, query_chunk: int = QUERY_CHUNK) -> None:
        self.comm, self.query_chunk = comm, query_chunk

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor,
                 mask: Tensor | None = None) -> Tensor:
        size, rank, local = self.comm.size, self.comm.rank, q.shape[0]
        valid = _key_blocks(mask, size, local)
        groups = q.shape[-2] // k.shape[-2]

        def heads(t: Tensor) -> Tensor:  # [S, KVH, Dh] -> [1, H, S, Dh] float32, kv heads repeated to the queries'
            return t.repeat_interleave(groups, dim=-2).float().transpose(0, 1)[None]

        qf = q.float().transpose(0, 1)[None] * (1.0 / math.sqrt(q.shape[-1]))  # [1, H, S/P, Dh]
        out = torch.zeros_like(qf)
        lse = torch.full(qf.shape[:-1], -math.inf, device=q.device)
        _merge(out, lse, qf, heads(prefix_k), heads(prefix_v), None, self.query_chunk)
        block = torch.stack((k, v))
        for step in range(size):
            owner = (rank - step) % size
            keys = valid[owner] if valid is not None else None
            if keys is None or bool(keys.any()):
                _merge(out, lse, qf, heads(block[0]), heads(block[1]), keys, self.query_chunk)
            if step < size - 1:
                block = self.comm.shift(block)
        return out[0].transpose(0, 1).to(q.dtype)


def wrap_prefixed(layer: PrefixedLayer, comm: Comm) -> None:
    """Ulysses where P divides the layer's query heads, else ring attention (runtime.parallel.plan.sp_attention)."""
    if layer.num_heads % comm.size:
        layer.attention_fn = PrefixedRing(comm)
    else:
        layer.attention_fn = PrefixedUlysses(comm, layer.num_heads, layer.kv_heads)
