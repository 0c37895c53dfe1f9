"""Paged KV: block bookkeeping, admission by blocks, and attention through block tables equal to a contiguous cache."""

from __future__ import annotations

import pytest
import torch

from vidloom.core.errors import CacheBudgetExceeded, KVPoolBusy
from vidloom.families.cosmos3.config import Cosmos3TextConfig
from vidloom.families.cosmos3.transformer import Cosmos3Transformer
from vidloom.layers.rotary import text_positions
from vidloom.runtime.paged_kv import BlockAllocator, ContiguousKV, DecodeKV, KVLayout, PagedKVPool

CONFIG = Cosmos3TextConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                           rope_theta=10000.0, rope_axes_dim=(2, 1, 1))


def test_allocator_reserves_whole_blocks_and_returns_them():
    alloc = BlockAllocator(num_blocks=6, block_size=4)
    assert alloc.reserve("a", 9) == [0, 1, 2]  # 9 tokens -> 3 blocks
    assert alloc.reserve("b", 4) == [3]
    assert alloc.blocks_in_use == 4
    assert alloc.release("a") == 3 and alloc.release("a") == 0  # second release is a no-op
    assert sorted(alloc.reserve("c", 16)) == [0, 1, 2, 4]  # freed blocks are reused
    with pytest.raises(ValueError):
        alloc.reserve("c", 1)


def test_admission_refuses_with_the_reason_and_holds_nothing():
    alloc = BlockAllocator(num_blocks=4, block_size=16)
    alloc.reserve("a", 40)  # 3 blocks
    with pytest.raises(CacheBudgetExceeded) as exc:
        alloc.reserve("b", 17)  # needs 2, 1 free
    assert "kv_pool_tokens=64" in str(exc.value) and "17 tokens" in str(exc.value)
    assert (exc.value.needed, exc.value.in_use, exc.value.budget) == (2, 3, 4)
    assert alloc.blocks_in_use == 3
    alloc.reserve("b", 16)  # exactly what is free still fits


def test_a_sequence_that_fits_the_empty_pool_finds_it_busy_one_that_never_fits_does_not():
    alloc = BlockAllocator(num_blocks=4, block_size=16)
    alloc.reserve("a", 40)  # 3 blocks held
    with pytest.raises(KVPoolBusy):  # 2 blocks: fits once "a" leaves (a run stepped among others waits)
        alloc.reserve("b", 17)
    with pytest.raises(CacheBudgetExceeded) as exc:  # 5 blocks: more than the whole pool, never fits
        alloc.reserve("c", 65)
    assert not isinstance(exc.value, KVPoolBusy)
    alloc.release("a")
    assert len(alloc.reserve("b", 17)) == 2 and alloc.blocks_in_use == 2


def _model() -> Cosmos3Transformer:
    torch.manual_seed(0)
    model = Cosmos3Transformer(CONFIG).eval()
    with torch.no_grad():
        model.embed.weight.normal_()
    return model


@torch.no_grad()
def test_paged_kv_equals_contiguous_kv():
    """A fragmented block table (blocks of other sequences in between) must read back what was written."""
    model = _model()
    pool = PagedKVPool(KVLayout(2, 2, 8, num_blocks=12, block_size=4), torch.device("cpu"), torch.float32)
    pool.allocator.reserve("other-1", 4)
    pool.allocator.reserve("seq", 30)
    pool.allocator.release("other-1")
    pool.allocator.reserve("other-2", 8)  # takes block 0 back, so "seq" is not first in the pool
    contiguous = ContiguousKV(2, model.attention_scale)
    tokens = torch.randint(0, 50, (20,))
    start, feeds = 0, [tokens[:9], *tokens[9:].split(1)]  # prefill 9, then one token per step (crossing blocks)
    for feed in feeds:
        pos = text_positions(start, len(feed))
        last = torch.tensor([len(feed) - 1])
        paged = model(feed, pos, kv=pool.batch([("seq", start, len(feed))], model.attention_scale), logits_at=last)
        ref = model(feed, pos, kv=contiguous, logits_at=last)
        assert (paged - ref).abs().max().item() < 1e-6
        start += len(feed)
    full = model(tokens, text_positions(0, 20))[-1]  # uncached forward of the whole sequence
    assert (paged[0] - full).abs().max().item() < 1e-5


@torch.no_grad()
def test_packed_batch_of_different_lengths_equals_each_alone():
    """Prefill of one sequence and decode of another in one packed forward: each gets its own logits."""
    model = _model()
    pool = PagedKVPool(KVLayout(2, 2, 8, num_blocks=16, block_size=4), torch.device("cpu"), torch.float32)
    a, b = torch.randint(0, 50, (11,)), torch.randint(0, 50, (5,))
    pool.allocator.reserve("a", 16)
    pool.allocator.reserve("b", 16)
    scale = model.attention_scale
    model(a[:10], text_positions(0, 10), kv=pool.batch([("a", 0, 10)], scale))  # a has 10 cached tokens
    packed = torch.cat([a[10:], b])
    positions = torch.cat([text_positions(10, 1), text_positions(0, 5)], dim=1)
    both = model(packed, positions, kv=pool.batch([("a", 10, 1), ("b", 0, 5)], scale), logits_at=torch.tensor([0, 5]))
    alone_a = model(a, text_positions(0, 11))[-1]
    alone_b = model(b, text_positions(0, 5))[-1]
    assert (both[0] - alone_a).abs().max().item() < 1e-5
    assert (both[1] - alone_b).abs().max().item() < 1e-5


@torch.no_grad()
def test_batched_decode_of_different_context_lengths_equals_each_alone():
    """Pure decode steps (one new token per sequence, the no-gather path) over contexts of 3, 7 and 12 tokens."""
    model = _model()
    pool = PagedKVPool(KVLayout(2, 2, 8, num_blocks=24, block_size=4), torch.device("cpu"), torch.float32)
    scale = model.attention_scale
    seqs = {name: torch.randint(0, 50, (n + 3,)) for name, n in (("a", 3), ("b", 7), ("c", 12))}
    cached = {name: len(ids) - 3 for name, ids in seqs.items()}
    for name, ids in seqs.items():
        pool.allocator.reserve(name, len(ids))
        model(ids[:cached[name]], text_positions(0, cached[name]), kv=pool.batch([(name, 0, cached[name])], scale))
    for _ in range(3):
        names = list(seqs)
        feed = torch.stack([seqs[n][cached[n]] for n in names])
        positions = torch.cat([text_positions(cached[n], 1) for n in names], dim=1)
        kv = pool.batch([(n, cached[n], 1) for n in names], scale)
        logits = model(feed, positions, kv=kv, logits_at=torch.arange(len(names)))
        for row, n in zip(logits, names):
            cached[n] += 1
            alone = model(seqs[n][:cached[n]], text_positions(0, cached[n]))[-1]
            assert (row - alone).abs().max().item() < 1e-5


@torch.no_grad()
def test_decode_kv_with_padding_rows_equals_the_paged_decode_and_writes_only_scratch():
    """DecodeKV (a captured decode graph's attention: keys over a bucketed table width, masked) gives each real row
    the PagedBatch decode's logits; its padding rows write only to the scratch block past the allocator's."""
    model = _model()
    pool = PagedKVPool(KVLayout(2, 2, 8, num_blocks=12, block_size=4, scratch_blocks=1), torch.device("cpu"),
                       torch.float32)
    assert pool.scratch_block == 12 and pool.k.shape[1] == 13 * 4 and pool.allocator.num_blocks == 12
    scale = model.attention_scale
    seqs = {name: torch.randint(0, 50, (n + 1,)) for name, n in (("a", 2), ("b", 9))}
    for name, ids in seqs.items():
        pool.allocator.reserve(name, len(ids))
        model(ids[:-1], text_positions(0, len(ids) - 1), kv=pool.batch([(name, 0, len(ids) - 1)], scale))
    held = pool.k[:, :48].clone()
    names, starts = list(seqs), [len(seqs[n]) - 1 for n in seqs]
    feed = torch.stack([seqs[n][-1] for n in names] + [torch.tensor(0)] * 2)  # two padding rows
    positions = torch.cat([text_positions(s, 1) for s in starts] + [text_positions(0, 2)], dim=1)
    width = 4  # a bucket wider than any row needs (3 blocks)
    tables = torch.tensor([pool.allocator.table(n)[:width] + [12] * (width - len(pool.allocator.table(n)[:width]))
                           for n in names] + [[12] * width] * 2)
    graphed = model(feed, positions, kv=DecodeKV(pool, tables, torch.tensor(starts + [0, 0]), scale))
    for row, n in zip(graphed, names):
        alone = model(seqs[n], text_positions(0, len(seqs[n])))[-1]
        assert (row - alone).abs().max().item() < 1e-5
    changed = (pool.k[:, :48] != held).any(-1).any(-1).any(0).nonzero().flatten().tolist()
    slots = {pool.allocator.table(n)[s // 4] * 4 + s % 4 for n, s in zip(names, starts)}
    assert set(changed) == slots  # besides each real row's own new slot, only the scratch block was written
