"""Attention between two sharded streams (LTX-2's audio<->video): each rank holds 1/P of the queries' stream and 1/P
of the keys' stream, and every query must see every key.

Two exchanges give the one-device result, and the wrapper takes the one that moves fewer values for the shapes of
the call (the same on every rank, so every rank takes the same path):

- gathered keys: all-gather the other stream's keys and values; each rank attends its own queries to all of them
  (any head count). Per rank it receives (P - 1) x 2 key shards: cheap when the key stream is the short one (audio
  keys of video queries).
- Ulysses: all-to-all the queries and the keys/values to head shards (every token, H/P heads), attend, all-to-all
  the output back (heads divisible by P). Per rank it sends (P - 1)/P of its query, key, value and output rows:
  cheaper when the key stream is the long one (video keys of audio queries), by about P.

Pad rows (a stream padded at its end to split) are no keys: `mask` is the key stream's pad mask. Pad query rows
attend like any other and are cut off before the head.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vidloom.layers.attention import AttentionFn
from vidloom.runtime.parallel.comm import Comm
from vidloom.runtime.parallel.ulysses import _real_tokens, heads_to_seq, seq_to_heads


class ShardedCrossAttention:
    """Cross-attention of this rank's query rows to every key row of another sharded stream."""

    def __init__(self, inner: AttentionFn, comm: Comm, num_heads: int) -> None:
        self.inner = inner
        self.comm = comm
        self.num_heads = num_heads

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """q [B, Sq/P, H, Dh], k, v [B, Sk/P, H, Dh] -> [B, Sq/P, H, Dh]. `mask`: None, or the key stream's pad mask
        [Sk] (CPU bool, JointPart.key_mask)."""
        if self.ulysses(q.shape[1], k.shape[1]):
            return self._ulysses(q, k, v, mask)
        kv = self.comm.all_gather(torch.stack((k, v)))  # [P, 2, B, Sk/P, H, Dh]
        kv = kv.movedim(0, 2).flatten(2, 3)  # [2, B, Sk, H, Dh], rank order == token order
        real = kv.shape[2] if mask is None else _real_tokens(mask, kv.shape[2])
        return self.inner(q, kv[0, :, :real], kv[1, :, :real])

    def ulysses(self, queries: int, keys: int) -> bool:
        """Whether a call with these local row counts exchanges head shards (else it gathers the keys)."""
        p = self.comm.size
        return self.num_heads % p == 0 and queries < (p - 1) * keys

    def _ulysses(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        q = seq_to_heads(q, self.comm)  # [B, Sq, H/P, Dh]
        kv = seq_to_heads(torch.stack((k, v)), self.comm)  # [2, B, Sk, H/P, Dh]
        real = kv.shape[2] if mask is None else _real_tokens(mask, kv.shape[2])
        return heads_to_seq(self.inner(q, kv[0, :, :real], kv[1, :, :real]), self.comm)
