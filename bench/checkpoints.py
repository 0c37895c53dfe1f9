"""Benchmark sizes: random-weight Wan2.1 checkpoints written by diffusers, and the request each runs.

`tiny` runs in seconds, `mid` in about a minute on 2 CPU cores, `real-1.3b` is the
real Wan2.1-T2V-1.3B DiT and VAE (random weights) and only makes sense on CUDA.
Checkpoints are written once into bench/.cache/ (git-ignored) and reused.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/x.py` from anywhere
    sys.path.insert(0, str(ROOT))

from tests.helpers.wan_checkpoints import TINY_A, TinyWan, wan_dit, wan_vae, write_tiny_wan  # noqa: E402
from vidloom.demo.cache import ensure_written  # noqa: E402
from vidloom.families.wan.demo import DEMO_TEXT_ENCODER  # noqa: E402

CACHE = ROOT / "bench" / ".cache"



@dataclass(frozen=True)
class BenchSize:
    """One benchmark size: the checkpoint's architecture and the request run on it."""

    spec: TinyWan
    """Architecture of the random-weight checkpoint."""
    height: int
    """Video height in pixels."""
    width: int
    """Video width in pixels."""
    num_frames: int
    """Frames (4k+1)."""
    steps: int
    """Denoise steps."""
    needs_cuda: bool = False
    """Too large for CPU: skipped without CUDA."""
    thresholds: dict[str, float] = field(default_factory=dict)
    """Step-cache threshold per policy, picked so some but not all steps are skipped. Random weights
    change far more per step than trained ones, hence large values. Keep fbcache's below 1.0:
    cache-dit reads a threshold >= 1 as "always reuse", which would not be the same method."""


SIZES: dict[str, BenchSize] = {
    "tiny": BenchSize(
        replace(TINY_A, name="tiny"),
        height=32, width=48, num_frames=9, steps=10, thresholds={"teacache": 0.3, "fbcache": 0.15},
    ),
    "mid": BenchSize(
        TinyWan(
            name="mid",
            transformer=wan_dit(heads=8, head_dim=64, channels=16, ffn_dim=1536, layers=14, freq_dim=256, text_dim=64,
                                rope_max_seq_len=1024),
            vae=wan_vae(base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1),
            text_encoder=DEMO_TEXT_ENCODER,  # wan2.1-demo's
        ),
        height=256, width=256, num_frames=17, steps=20, thresholds={"teacache": 0.6, "fbcache": 0.95},
    ),
    # Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json and vae/config.json; the text
    # encoder keeps UMT5-XXL's width (4096, what the DiT reads) but only 2 layers, since the
    # benchmark times the DiT and VAE, not prompt encoding.
    "real-1.3b": BenchSize(
        TinyWan(
            name="real-1.3b",
            transformer=wan_dit(heads=12, head_dim=128, channels=16, ffn_dim=8960, layers=30, freq_dim=256,
                                text_dim=4096, rope_max_seq_len=1024),
            vae=wan_vae(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2),
            text_encoder={"d_model": 4096, "d_kv": 64, "d_ff": 1024, "num_layers": 2, "num_heads": 64,
                          "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
                          "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0},
        ),
        height=480, width=832, num_frames=33, steps=20, needs_cuda=True, thresholds={"teacache": 0.2, "fbcache": 0.1},
    ),
}


def cached(name: str, write: Callable[[Path], Any], marker: str = "model_index.json") -> Path:
    """`CACHE/name`, written by `write(folder)` on first use: staged, then renamed, so a run cut short leaves no
    half-written folder (every benchmark's checkpoints go through here)."""
    return ensure_written(CACHE, name, write, marker)


def ensure_checkpoint(size: str) -> Path:
    """The checkpoint folder for `size`, written on first use."""
    spec = SIZES[size].spec
    return cached(spec.name, lambda folder: write_tiny_wan(folder, spec))
