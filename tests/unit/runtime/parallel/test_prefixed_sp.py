"""Generated rows over a replicated prefix K/V under sequence parallel (runtime/parallel/ulysses.py's PrefixedUlysses, ring.py's PrefixedRing), ranks as
threads: equal to one device's attention for split and unsplit grouped K/V heads, Ulysses and ring, padded or not."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.families.cosmos3.generation import JointAttention, prefixed_attention
from vidloom.runtime.parallel.ring import PrefixedRing
from vidloom.runtime.parallel.ulysses import PrefixedUlysses, apply_sp

# fp32: the exchanges copy values; only summation order moves (head subsets in one kernel, log-sum-exp merges of
# the ring's blocks); 1e-5 still catches a prefix slice of the wrong heads or a pad row taken as a key (order 1).
FP32_TOL = 1e-5
PREFIX = 5


def _tensors(seq: int, heads: int, kv_heads: int, dim: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seq * 10 + heads)
    return (torch.randn(seq, heads, dim, generator=g), torch.randn(seq, kv_heads, dim, generator=g),
            torch.randn(seq, kv_heads, dim, generator=g), torch.randn(PREFIX, kv_heads, dim, generator=g) * 1.3,
            torch.randn(PREFIX, kv_heads, dim, generator=g) * 0.7)


class _Model:
    """The sequence-parallel hooks of a model whose one attention reads a prefix (Cosmos3's generator)."""

    def __init__(self, layer: JointAttention) -> None:
        self.layer = layer

    def self_attentions(self) -> tuple[()]:
        return ()

    def prefixed_attentions(self) -> tuple[JointAttention]:
        return (self.layer,)


# (ranks, heads, kv heads, how): Ulysses with kv heads split, Ulysses with kv heads repeated, ring twice.
CASES = [(2, 4, 2, "ulysses"), (4, 4, 2, "ulysses"), (4, 6, 3, "ring"), (2, 3, 1, "ring")]


@pytest.mark.parametrize(("size", "heads", "kv_heads", "how"), CASES)
@pytest.mark.parametrize("real", [12, 9])
def test_sharded_generated_rows_see_the_whole_prefix_and_every_generated_key(size, heads, kv_heads, how, real):
    padded = real + (-real % size)
    q, k, v, pk, pv = _tensors(padded, heads, kv_heads)
    full = prefixed_attention(q[:real], k[:real], v[:real], pk, pv)
    mask = torch.arange(padded) < real if padded > real else None
    local = padded // size

    def rank(comm):
        layer = JointAttention(heads, kv_heads)  # the Cosmos3 generator's, as apply_sp finds it
        apply_sp(_Model(layer), comm)
        assert isinstance(layer.attention_fn, PrefixedUlysses if how == "ulysses" else PrefixedRing)
        rows = slice(comm.rank * local, (comm.rank + 1) * local)
        return layer.attention_fn(q[rows], k[rows], v[rows], pk, pv, mask)

    out = torch.cat(run_ranks(thread_group(size), rank))[:real]
    assert (out - full).abs().max().item() <= FP32_TOL
