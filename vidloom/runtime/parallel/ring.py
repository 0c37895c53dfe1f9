"""Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers", arXiv:2310.01889): sequence
parallel when the degree does not divide the head count, as USP (Fang and Zhao 2024, arXiv:2405.07719) falls back to.

Each of P ranks keeps its 1/P of the queries and passes its keys and values around the ring: at step j it holds the
block of rank (r - j) mod P, attends its queries to it, and merges the block's result into a running one by
log-sum-exp (the same rescaling a flash kernel does across key tiles). After P steps every query has seen every key;
no head is split, so any head count runs. The blocks' attention is written out here in float32 (the configured
backend has no log-sum-exp output), in query chunks that bound the score matrix. Ulysses (ulysses.py) stays the
choice wherever sp divides the heads: one all-to-all pair per layer instead of P - 1 shifts, and the backend's
kernel.

PrefixedRing is the same ring for generated rows that also attend to a prefix K/V every rank holds whole (Cosmos3's
prompt): the prefix is one more block, attended locally before the ring turns.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vidloom.runtime.parallel.comm import Comm

QUERY_CHUNK = 1024
"""Queries per score matrix [B, H, QUERY_CHUNK, S/P] (float32): bounds the memory of one block's attention."""


class RingAttention:
    """Self-attention over the whole sequence when each rank holds 1/P of the tokens, any head count."""

    def __init__(self, comm: Comm, query_chunk: int = QUERY_CHUNK) -> None:
        self.comm = comm
        self.query_chunk = query_chunk

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """q, k, v: [B, S/P, H, Dh] -> [B, S/P, H, Dh]. `mask`: None, or the key mask [S] (CPU bool) of a
        sequence padded at its end to split (JointPart.key_mask): the pad rows are no keys. Keys may be of another
        length than the queries (AnyFlow-FAR's [KV cache, chunk]): k, v [B, Sk/P, H, Dh], `mask` [Sk] in rank
        order, its pad rows anywhere."""
        if k.shape != v.shape or k.shape[::2] != q.shape[::2] or k.shape[-1] != q.shape[-1]:
            raise ValueError(f"ring attention takes k, v of one shape and q of their batch, heads and head size, got "
                             f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        size, rank, local = self.comm.size, self.comm.rank, k.shape[1]
        valid = _key_blocks(mask, size, local)
        qf = q.float().transpose(1, 2) * (1.0 / math.sqrt(q.shape[-1]))  # [B, H, S/P, Dh]
        out = torch.zeros_like(qf)
        lse = torch.full(qf.shape[:-1], -math.inf, device=q.device)  # [B, H, S/P]
        block = torch.stack((k, v))
        for step in range(size):
            owner = (rank - step) % size
            keys = valid[owner] if valid is not None else None
            if keys is None or bool(keys.any()):
                _merge(out, lse, qf, block[0].float().transpose(1, 2), block[1].float().transpose(1, 2), keys,
                       self.query_chunk)
            if step < size - 1:
                block = self.comm.shift(block)
        return out.transpose(1, 2).to(q.dtype)


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


def _key_blocks(mask: Tensor | None, size: int, local: int) -> list[Tensor] | None:
    """Each rank's rows of the pad mask (True: a real key), or None when nothing is padded."""
    if mask is None:
        return None
    if mask.dim() != 1 or mask.shape[0] != size * local or mask.dtype != torch.bool or mask.device.type != "cpu":
        raise ValueError(f"ring attention takes only a padded sequence's key mask ([{size * local}] bool on the CPU), "
                         f"got {tuple(mask.shape)} {mask.dtype} on {mask.device}")
    return list(mask.view(size, local))


def _merge(out: Tensor, lse: Tensor, q: Tensor, k: Tensor, v: Tensor, keys: Tensor | None, chunk: int) -> None:
    """Attend q [B, H, Sq, Dh] (scaled) to one key block k, v [B, H, Sk, Dh] and fold it into out / lse in place."""
    if keys is not None:
        keep = keys.to(k.device)
        k, v = k[:, :, keep], v[:, :, keep]
    for start in range(0, q.shape[2], chunk):
        rows = slice(start, start + chunk)
        scores = q[:, :, rows] @ k.transpose(-1, -2)  # [B, H, chunk, Sk]
        block_lse = torch.logsumexp(scores, dim=-1)
        block_out = torch.softmax(scores, dim=-1) @ v
        merged = torch.logaddexp(lse[:, :, rows], block_lse)
        out[:, :, rows] = (out[:, :, rows] * torch.exp(lse[:, :, rows] - merged)[..., None]
                           + block_out * torch.exp(block_lse - merged)[..., None])
        lse[:, :, rows] = merged
