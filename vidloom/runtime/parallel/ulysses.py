"""Ulysses sequence parallelism (Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv:2309.14509).

Each of P ranks holds a contiguous 1/P of the video tokens through the whole block: norms,
projections, RoPE, cross-attention and the FFN are per-token, so they run on the shard as
they are. Only self-attention needs every token; around it, one all-to-all turns
[B, S/P, H, Dh] (my tokens, all heads) into [B, S, H/P, Dh] (all tokens, my heads), the
configured attention backend runs on whole heads, and a second all-to-all turns the result
back. The exchanges move data without arithmetic, so the only numeric difference from one
device is reduction order in kernels that see different shapes.

An MMDiT (Flux2, Qwen-Image) joins its text tokens in front of the image tokens and shards the
joined sequence the same way (`shard_joint`): a rank may hold text rows, image rows or both, and
each side's weights run on its own rows. A joined sequence that does not split is padded at its
end; the pad rows are dropped after the first all-to-all (no key, no query) and cut off before the head.

A model with two sharded streams (LTX-2: video and audio) shards each on its own; an attention whose queries are
one stream's and whose keys are the other's reaches every key through ShardedCrossAttention.

Generated rows that also attend to a prefix K/V every rank holds whole (Cosmos3: each CFG branch's prompt, prefilled
once per request by a causal text pathway that never reads a generated row) shard as one stream; the prefix never
enters an exchange (PrefixedUlysses: each rank reads its heads' slice of it; ring.PrefixedRing: all of it).

Applied from outside the model, like gpt-fast's apply_tp: `apply_sp(model, comm)` swaps the
model's token layout and wraps its self-attention functions.
"""

from __future__ import annotations

from typing import Iterable, Protocol

import torch
from torch import Tensor

from vidloom.layers.attention import AttentionFn
from vidloom.layers.grouped_attention import grouped_attention
from vidloom.layers.sequence import JointPart, SequenceLayout
from vidloom.runtime.parallel.comm import Comm
from vidloom.runtime.parallel.ring import PrefixedRing, RingAttention


def seq_to_heads(x: Tensor, comm: Comm) -> Tensor:
    """[..., S/P, H, Dh] (this rank's tokens, all heads) -> [..., S, H/P, Dh] (all tokens, this rank's heads)."""
    p = comm.size
    # Chunk j of the send buffer is head group j, which rank j owns.
    send = x.unflatten(-2, (p, x.shape[-2] // p)).movedim(-3, 0)  # [P, ..., S/P, H/P, Dh]
    received = comm.all_to_all(send)  # chunk i: rank i's tokens of my heads
    return received.movedim(0, -4).flatten(-4, -3)  # [..., P * S/P, H/P, Dh], tokens in rank order


def heads_to_seq(x: Tensor, comm: Comm) -> Tensor:
    """[..., S, H/P, Dh] (all tokens, this rank's heads) -> [..., S/P, H, Dh] (this rank's tokens, all heads)."""
    p = comm.size
    # Chunk j of the send buffer is token shard j, which rank j owns.
    send = x.unflatten(-3, (p, x.shape[-3] // p)).movedim(-4, 0)  # [P, ..., S/P, H/P, Dh]
    received = comm.all_to_all(send)  # chunk i: head group i of my tokens
    return received.movedim(0, -3).flatten(-3, -2)  # [..., S/P, P * H/P, Dh], heads in order


class UlyssesAttention:
    """Self-attention over the whole sequence when each rank holds 1/P of the tokens."""

    def __init__(self, inner: AttentionFn, comm: Comm) -> None:
        self.inner = inner
        self.comm = comm

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """q, k, v: [B, S/P, H, Dh] -> [B, S/P, H, Dh]. `mask`: None, or the key mask [S] (CPU bool) of a
        sequence padded at its end to split (JointPart.key_mask).

        Keys of another length than the queries (a causal model's queries over [its KV cache, themselves], each
        segment sharded and padded on its own: AnyFlow-FAR) take `mask` [Sk] (CPU bool) in rank order, True
        wherever a key is real: every query row attends to the real keys."""
        if q.shape[2] % self.comm.size:
            raise ValueError(f"{q.shape[2]} heads do not split over {self.comm.size} ranks")
        if k.shape != q.shape or (mask is not None and not _padded_at_end(mask)):
            q = seq_to_heads(q, self.comm)  # [B, Sq, H/P, Dh]
            kv = seq_to_heads(torch.stack((k, v)), self.comm)  # [2, B, Sk, H/P, Dh], rank order
            keys = _key_rows(mask, kv.shape[2], k.device)
            return heads_to_seq(self.inner(q, kv[0, :, keys], kv[1, :, keys]), self.comm)
        # One exchange for q, k and v together: a third of the collective launches.
        qkv = seq_to_heads(torch.stack((q, k, v)), self.comm)  # [3, B, S, H/P, Dh]
        padded = qkv.shape[2]
        real = padded if mask is None else _real_tokens(mask, padded)
        out = self.inner(qkv[0, :, :real], qkv[1, :, :real], qkv[2, :, :real])  # [B, real, H/P, Dh]
        if real < padded:  # the pad rows' outputs: zeros, cut off before the head
            out = torch.cat([out, out.new_zeros((out.shape[0], padded - real, *out.shape[2:]))], dim=1)
        return heads_to_seq(out, self.comm)


def _real_tokens(mask: Tensor, padded: int) -> int:
    if mask.dim() != 1 or mask.shape[0] != padded or mask.dtype != torch.bool or mask.device.type != "cpu":
        raise ValueError(f"Ulysses attention takes only a padded sequence's key mask ([{padded}] bool on the CPU), "
                         f"got {tuple(mask.shape)} {mask.dtype} on {mask.device}")
    return int(mask.sum())


def _padded_at_end(mask: Tensor) -> bool:
    return bool(mask[: int(mask.sum())].all())


def _key_rows(mask: Tensor | None, keys: int, device: torch.device) -> slice | Tensor:
    """Which of `keys` gathered key rows are real: all, the first ones (one padded stream) or any (several)."""
    if mask is None:
        return slice(None)
    real = _real_tokens(mask, keys)
    return slice(0, real) if _padded_at_end(mask) else mask.to(device)


class ShardedCrossAttention:
    """Attention between two sharded streams (LTX-2's audio<->video): each rank holds 1/P of the queries' stream and
    1/P of the keys' stream, and every query must see every key. Two exchanges give the one-device result, and a call
    takes the one that moves fewer values for its shapes (the same on every rank, so every rank takes the same path):

    - gathered keys: all-gather the other stream's keys and values; each rank attends its own queries to all of them
      (any head count). Per rank it receives (P - 1) x 2 key shards: cheap when the key stream is the short one
      (audio keys of video queries).
    - Ulysses: all-to-all the queries and the keys/values to head shards (every token, H/P heads), attend, all-to-all
      the output back (heads divisible by P). Per rank it sends (P - 1)/P of its query, key, value and output rows:
      cheaper when the key stream is the long one (video keys of audio queries), by about P.

    Pad rows (a stream padded at its end to split) are no keys: `mask` is the key stream's pad mask. Pad query rows
    attend like any other and are cut off before the head."""

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


class TokenShards:
    """A SequenceLayout: rank r keeps tokens [r * S/P, (r + 1) * S/P) and the same rows of the per-token tables."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def shard(self, tokens: Tensor, tables: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        seq = tokens.shape[1]
        if seq % self.comm.size:
            # Requests are checked at submit (runtime.parallel.plan); this guards direct callers.
            raise ValueError(f"{seq} tokens do not split evenly over sp={self.comm.size} ranks (no padding)")
        chunk = seq // self.comm.size
        rows = slice(self.comm.rank * chunk, (self.comm.rank + 1) * chunk)
        return tokens[:, rows].contiguous(), tuple(table[rows] for table in tables)

    def gather(self, tokens: Tensor) -> Tensor:
        gathered = self.comm.all_gather(tokens)  # [P, B, S/P, D]
        return gathered.movedim(0, 1).flatten(1, 2)  # [B, S, D], rank order == token order

    def shard_joint(self, tokens: Tensor, tables: tuple[Tensor, ...], prefix: int) -> JointPart:
        length = tokens.shape[1]
        pad = -length % self.comm.size
        mask = None
        if pad:  # zero rows at the end; attention drops them (UlyssesAttention) and the head never sees them
            tokens = torch.cat([tokens, tokens.new_zeros((tokens.shape[0], pad, *tokens.shape[2:]))], dim=1)
            tables = tuple(torch.cat([t, t.new_zeros((pad, *t.shape[1:]))]) for t in tables)
            mask = torch.arange(length + pad) < length
        start = self.comm.rank * (tokens.shape[1] // self.comm.size)
        local, rows = self.shard(tokens, tables)
        return JointPart(local, rows, min(max(prefix - start, 0), local.shape[1]), length, mask)

    def gather_joint(self, tokens: Tensor, length: int) -> Tensor:
        return self.gather(tokens)[:, :length]


class SelfAttentionLayer(Protocol):
    num_heads: int
    attention_fn: AttentionFn


class SequenceParallelModel(Protocol):
    """The hooks a model exposes for apply_sp (WanTransformer, Flux2Transformer and QwenImageTransformer have them):
    `sequence` shards after embedding and gathers before the head; `self_attentions()` are the layers whose
    attention must see every token. A model with two sharded streams (LTX-2) also has `cross_attentions()`: layers
    whose queries are one stream's rows and whose keys are the other's (ShardedCrossAttention)."""

    sequence: SequenceLayout

    def self_attentions(self) -> Iterable[SelfAttentionLayer]: ...


def apply_sp(model: SequenceParallelModel, comm: Comm) -> None:
    """Make `model` run on this rank's 1/P of the tokens; every rank of `comm` must call it on its copy. A layer
    whose heads P divides attends through Ulysses, any other through ring attention (ring.py); a cross-stream
    attention through ShardedCrossAttention; a `prefixed_attentions()` layer (generated rows over a prefix K/V every
    rank holds whole) through PrefixedUlysses or PrefixedRing. A model that lays its tokens out its own way names that layout's class
    as `sharded_sequence` (SANA-WM's frame rows, which exchange around its linear attention themselves)."""
    for layer in model.self_attentions():
        if layer.num_heads % comm.size:
            layer.attention_fn = RingAttention(comm)
        else:
            layer.attention_fn = UlyssesAttention(layer.attention_fn, comm)
    cross_attentions = getattr(model, "cross_attentions", None)
    for layer in cross_attentions() if cross_attentions is not None else ():
        layer.attention_fn = ShardedCrossAttention(layer.attention_fn, comm, layer.num_heads)
    prefixed_attentions = getattr(model, "prefixed_attentions", None)
    for layer in prefixed_attentions() if prefixed_attentions is not None else ():
        layer.attention_fn = (PrefixedRing(comm) if layer.num_heads % comm.size
                              else PrefixedUlysses(comm, layer.num_heads, layer.kv_heads))
    model.sequence = getattr(model, "sharded_sequence", TokenShards)(comm)
