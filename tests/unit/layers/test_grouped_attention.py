"""grouped_attention (the GQA of Cosmos3, Qwen-Omni and the paged KV store) against a naive float64 reference that
repeats K/V per query head."""

from __future__ import annotations

import pytest
import torch

from vidloom.layers.grouped_attention import grouped_attention


def _reference(q, k, v, scale, mask):
    """q [B, S, H, D], k/v [B, L, KVH, D], mask [B, S, L] -> [B, S, H, D], by the definition."""
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, dim=2).double(), v.repeat_interleave(groups, dim=2).double()
    scores = torch.einsum("bshd,blhd->bhsl", q.double(), k) * scale
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return torch.einsum("bhsl,blhd->bshd", scores.softmax(-1), v).float()


@pytest.mark.parametrize("queries,keys", [(1, 13), (5, 9), (6, 6)])
def test_masked_attention_folds_query_heads_like_repeating_kv(queries: int, keys: int):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, queries, 8, 16), torch.randn(3, keys, 2, 16), torch.randn(3, keys, 2, 16)
    mask = torch.rand(3, queries, keys) > 0.4
    mask[..., 0] = True  # every row sees a key
    out = grouped_attention(q, k, v, 0.25, mask=mask)
    assert out.shape == q.shape
    assert (out - _reference(q, k, v, 0.25, mask)).abs().max().item() < 1e-5
    # One sequence without a batch axis gives the same rows.
    alone = grouped_attention(q[1], k[1], v[1], 0.25, mask=mask[1])
    assert (alone - out[1]).abs().max().item() < 1e-6


def test_causal_attention_of_one_sequence():
    torch.manual_seed(1)
    q, k, v = torch.randn(7, 4, 16), torch.randn(7, 2, 16), torch.randn(7, 2, 16)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    out = grouped_attention(q, k, v, 0.25, causal=True)
    ref = _reference(q[None], k[None], v[None], 0.25, causal[None])[0]
    assert (out - ref).abs().max().item() < 1e-5


def test_a_key_mask_is_attention_over_the_kept_keys_alone():
    """One mask for every query row (Cosmos3's bucket-padded prompt keys): the masked keys, whatever they hold,
    weigh nothing, so the result is attention over the kept keys alone, with or without a batch axis."""
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 5, 8, 16), torch.randn(2, 11, 2, 16), torch.randn(2, 11, 2, 16)
    keep = torch.tensor([True] * 4 + [False] * 3 + [True] * 4)
    out = grouped_attention(q, k, v, 0.25, key_mask=keep)
    assert (out - grouped_attention(q, k[:, keep], v[:, keep], 0.25)).abs().max().item() < 1e-6
    assert (out - _reference(q, k, v, 0.25, keep.expand(2, 5, 11))).abs().max().item() < 1e-5
    alone = grouped_attention(q[1], k[1], v[1], 0.25, key_mask=keep)
    assert (alone - out[1]).abs().max().item() < 1e-6
