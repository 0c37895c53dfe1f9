"""Grouped-query attention over packed or paged keys: the primitive every GQA model and the paged KV store share,
and the KV-store contract a causal decoder calls (`KVAttention`)."""

from __future__ import annotations

from typing import Protocol

import torch.nn.functional as F
from torch import Tensor


def grouped_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, *, causal: bool = False,
                      mask: Tensor | None = None, key_mask: Tensor | None = None) -> Tensor:
    """GQA attention: q [..., S, H, D], k/v [..., L, KVH, D] -> [..., S, H, D]; `mask` [..., S, L] (True keeps).

    `key_mask` [L] bool (True keeps), one for every query row: handed to SDPA as [1, 1, 1, L], which its kernels
    broadcast (a per-row `mask` is folded and expanded to [B, 1, groups * S, L] instead, which a fused kernel's mask
    conversion would materialize: fine for decode's one query row, not for thousands).

    SDPA always gets 4-d (B, heads, S, D) inputs: PyTorch's CPU flash kernel takes only those (3-d ones
    fall back to the math path, several times slower). With a mask, each kv head's query heads are folded
    into its query rows instead of repeating K/V per query head (no K/V copy; decode's one query row per
    sequence becomes `groups` rows of one SDPA head).
    """
    if q.dim() == 3:  # one sequence: add the batch axis
        out = grouped_attention(q[None], k[None], v[None], scale, causal=causal,
                                mask=None if mask is None else mask[None], key_mask=key_mask)
        return out[0]
    b, s, heads, d = q.shape
    kv_heads = k.shape[-2]
    groups = heads // kv_heads
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, KVH, L, D]
    if mask is None:
        q = q.transpose(1, 2)
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        keys = None if key_mask is None else key_mask.view(1, 1, 1, -1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, is_causal=causal, scale=scale)
        return out.transpose(1, 2)
    # Query head h serves kv head h // groups (repeat_interleave's order): rows (group, position) per kv head.
    q = q.view(b, s, kv_heads, groups, d).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, groups * s, d)
    mask = mask.unsqueeze(-3).expand(b, groups, s, mask.shape[-1]).reshape(b, 1, groups * s, mask.shape[-1])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.view(b, kv_heads, groups, s, d).permute(0, 3, 1, 2, 4).reshape(b, s, heads, d)


class KVAttention(Protocol):
    """Where a forward's keys/values go and what each packed token attends to.

    A store may set `fixed_shapes = True` (runtime.paged_kv.DecodeKV, a captured decode step): the forward must then
    read nothing on the host, and layers with a host-sized path (a MoE dispatch) take their fixed one."""

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [T, H, D] and k/v [T, KVH, D] (after rotary) of this forward's T packed tokens -> [T, H, D].

        Stores k/v for later steps and attends each token causally to its own sequence's earlier tokens.
        """
        ...


class CausalAttention:
    """One sequence, no cache: plain causal attention over the forward's own tokens (reference path)."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return grouped_attention(q, k, v, self.scale, causal=True)
