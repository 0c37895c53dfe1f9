"""bench/far_batching.py times what it says: its three modes (alone, batched with per-request attention, batched with
concatenated KV) give the same step outputs, so the times compare the same work (tiny FAR config, float32)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from far_batching import measure  # noqa: E402

from tests.helpers.far_checkpoints import FAR_A  # noqa: E402
from vidloom.families.wan_causal.config import FarTransformerConfig  # noqa: E402
from vidloom.families.wan_causal.transformer import FarTransformer  # noqa: E402


def test_the_three_modes_give_the_same_steps():
    torch.manual_seed(0)
    model = FarTransformer(FarTransformerConfig.from_diffusers(FAR_A.transformer)).eval()
    row = measure(model, 3, size=32, chunk=2, repeats=1)  # chunk 2 of (1, 2, 2): 3 context frames in each slab
    assert row["requests"] == 3 and row["context_tokens"] == 12 and row["chunk_tokens"] == 8
    assert row["max_abs_diff_vs_alone"] <= 1e-5
    assert all(row[f"{mode}_cpu_s"] > 0 for mode in ("alone", "batched", "batched_concat_kv"))
