"""FAR chunk layout: which chunks are compressed, token counts, masks and KV slab sizing."""

from __future__ import annotations

import torch

from vidloom.models.wan.transformer import WanTransformerConfig
from vidloom.models.wan_causal.config import FarTransformerConfig
from vidloom.models.wan_causal.kv_cache import FarKVCache
from vidloom.models.wan_causal.layout import ChunkLayout

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


def test_masks_are_block_causal():
    layout = _layouts()[2]  # chunks (1, 3, 3): no compression yet
    mask = layout.prefill_mask(torch.device("cpu"))
    assert mask.shape == (4 * 24, 4 * 24)
    assert mask[0, :24].all() and not mask[0, 24:].any()  # chunk 0 sees itself only
    assert mask[-1].all()  # chunk 1 sees chunks 0-1
    full = layout.full_mask(torch.device("cpu"))
    assert full.shape == (7 * 24, layout.null_keys + 7 * 24)
    assert not full[: 4 * 24, : layout.null_keys].any()  # context never sees null keys
    assert full[4 * 24 :].all()  # the generated chunk sees everything


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
