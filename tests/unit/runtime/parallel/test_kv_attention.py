"""Ulysses and ring attention with queries over a longer key stream (a causal model's [KV cache, its own tokens],
each segment sharded and padded on its own, so pad keys sit anywhere in rank order): equal to attention over the
real keys on one device."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.layers.attention import attention
from vidloom.runtime.parallel.ring import RingAttention
from vidloom.runtime.parallel.ulysses import UlyssesAttention

FP32_TOL = 1e-5  # fp32 summation order only (observed <= 3e-7); a pad key taken as real moves outputs by ~0.1


def _shard(x: torch.Tensor, lengths: list[int], size: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s rows of each segment of x [B, S, H, D], each padded with zeros to a multiple of `size`."""
    parts, start = [], 0
    for n in lengths:
        rows = -(-n // size)
        seg = torch.cat([x[:, start : start + n], x.new_zeros(x.shape[0], rows * size - n, *x.shape[2:])], dim=1)
        parts.append(seg[:, rank * rows : (rank + 1) * rows])
        start += n
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize(("size", "heads", "kind"), [(2, 4, "ulysses"), (2, 3, "ring"), (3, 2, "ring")])
def test_queries_over_a_longer_key_stream_with_pad_keys_anywhere(size, heads, kind):
    g = torch.Generator().manual_seed(heads)
    key_segments, query_len = [5, 9, 4], 4  # the last key segment is the queries' own tokens
    q = torch.randn(2, query_len, heads, 8, generator=g)
    k, v = (torch.randn(2, sum(key_segments), heads, 8, generator=g) for _ in range(2))
    k[:, -query_len:] = q * 0.5
    full = attention(q, k, v)
    rows = [-(-n // size) for n in key_segments]
    mask = torch.cat([torch.arange(m) + r * m < n for r in range(size) for n, m in zip(key_segments, rows)])

    def one_rank(comm):
        wrapper = UlyssesAttention(attention, comm) if kind == "ulysses" else RingAttention(comm, query_chunk=3)
        local = _shard(q, [query_len], size, comm.rank)
        return wrapper(local, _shard(k, key_segments, size, comm.rank), _shard(v, key_segments, size, comm.rank), mask)

    out = torch.cat(run_ranks(thread_group(size), one_rank), dim=1)[:, :query_len]
    assert (out - full).abs().max().item() <= FP32_TOL
