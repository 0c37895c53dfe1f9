"""FAR chunk layout: which chunks are compressed, token counts, masks and KV slab sizing."""

from __future__ import annotations

import pytest
import torch

from vidloom.layers.attention import attention
from vidloom.models.wan.transformer_config import WanTransformerConfig
from vidloom.families.wan_causal.config import FarTransformerConfig
from vidloom.families.wan_causal.kv_cache import FarKVCache
from vidloom.families.wan_causal.layout import ChunkLayout, per_token
from vidloom.families.wan_causal.transformer import block_causal_attention

CONFIG = FarTransformerConfig(wan=WanTransformerConfig(num_attention_heads=2, attention_head_dim=12), full_chunk_limit=3)
PARTITION = (1, 3, 3, 3, 2)
HW = (8, 12)  # full grid 4x6 = 24 tokens/frame; compressed grid 2x3 = 6 tokens/frame


def _layouts() -> list[ChunkLayout]:
    return [ChunkLayout.for_chunk(PARTITION, k, HW, CONFIG) for k in range(len(PARTITION))]


def test_only_chunks_older_than_the_full_window_are_compressed():
    assert [layout.num_compressed_chunks for layout in _layouts()] == [0, 0, 0, 1, 2]
    last = _layouts()[-1]
    assert last.compressed_frames == 4 and last.context_frames == 10
    assert last.compressed_tokens == 4 * 6
    assert last.context_tokens == 4 * 6 + 6 * 24  # chunks 2-3 stay full
    assert last.generated_tokens == 2 * 24
    assert last.null_keys == 128 - 48


def test_chunk_ends_follow_compressed_then_full_tokens():
    assert _layouts()[2].chunk_ends() == [24, 4 * 24, 7 * 24]
    # Chunk 0 (1 frame) and chunk 1 (3 frames) are compressed once chunk 4 is generated.
    assert _layouts()[4].chunk_ends() == [6, 4 * 6, 4 * 6 + 3 * 24, 4 * 6 + 6 * 24, 4 * 6 + 8 * 24]


@pytest.mark.parametrize("null_keys", [0, 5])
def test_block_causal_attention_equals_a_masked_reference(null_keys):
    g = torch.Generator().manual_seed(0)
    ends = [3, 7, 12]
    q, k, v = (torch.randn(2, 12, 2, 8, generator=g) for _ in range(3))
    got = block_causal_attention(attention, q, k, v, ends, null_keys)
    chunk = torch.repeat_interleave(torch.arange(3), torch.tensor([3, 4, 5]))
    mask = chunk[:, None] >= chunk[None, :]
    null_mask = (chunk == 2)[:, None].expand(-1, null_keys)
    zeros = torch.zeros(2, null_keys, 2, 8)
    expected = attention(q, torch.cat([zeros, k], 1), torch.cat([zeros, v], 1), torch.cat([null_mask, mask], 1))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    # And causality is real: changing the last chunk's keys leaves earlier chunks' outputs alone.
    k2 = k.clone()
    k2[:, 7:] += 1
    changed = block_causal_attention(attention, q, k2, v, ends, null_keys)
    assert torch.equal(changed[:, :7], got[:, :7]) and not torch.equal(changed[:, 7:], got[:, 7:])


def test_kv_slab_fits_every_chunk_and_reports_its_bytes():
    layouts = _layouts()
    cache = FarKVCache.allocate(layouts, num_layers=2, batch=1, heads=2, head_dim=12,
                                device=torch.device("cpu"), dtype=torch.float32)
    assert cache.null == max(layout.null_keys for layout in layouts)
    assert cache.keys.shape[2] == cache.null + max(layout.total_tokens for layout in layouts)
    assert cache.nbytes == FarKVCache.bytes_needed(layouts, 2, 1, 2, 12, torch.float32)
    k = torch.ones(1, 5, 2, 12)
    cache.write(1, 3, k, k)
    keys, _ = cache.read(1, null_keys=4, end=8)
    assert keys.shape[1] == 12 and keys[:, :7].abs().sum() == 0 and keys[:, 7:].eq(1).all()


def test_per_token_rows_equal_repeat_interleave_with_a_count_tensor():
    # The last layout mixes compressed frames (6 tokens) and full ones (24): two runs of equal counts.
    counts = _layouts()[-1].frame_tokens()
    x = torch.randn(2, len(counts), 3)
    want = x.repeat_interleave(torch.tensor(counts), dim=1)
    assert torch.equal(per_token(x, counts), want)
    assert torch.equal(per_token(x[:, -2:], counts[-2:]), want[:, -48:])  # a generated chunk: one run


def test_a_slab_handed_to_another_request_starts_without_context_and_keys_alike():
    layouts = _layouts()
    key = FarKVCache.reuse_key(layouts, 2, 1, 2, 12, torch.device("cpu"), torch.float32)
    assert key == FarKVCache.reuse_key(layouts, 2, 1, 2, 12, torch.device("cpu"), torch.float32)
    assert key != FarKVCache.reuse_key(layouts, 2, 2, 2, 12, torch.device("cpu"), torch.float32)  # CFG on
    cache = FarKVCache.allocate(layouts, 2, 1, 2, 12, torch.device("cpu"), torch.float32)
    cache.context_tokens, cache.context_rows = 30, 30
    assert cache.clear_context() is cache and (cache.context_tokens, cache.context_rows) == (0, 0)
    assert len({cache, FarKVCache(cache.keys, cache.values, cache.null)}) == 2  # hashed by identity (graph keys)
