"""Benchmark sizes: random-weight Wan2.1 checkpoints written by diffusers, and the request each runs.

`tiny` runs in seconds, `mid` in about a minute on 2 CPU cores, `real-1.3b` is the
real Wan2.1-T2V-1.3B DiT and VAE (random weights) and only makes sense on CUDA.
Checkpoints are written once into bench/.cache/ (git-ignored) and reused.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/x.py` from anywhere
    sys.path.insert(0, str(ROOT))

from tests.helpers.wan_checkpoints import TinyWan, write_tiny_wan  # noqa: E402

CACHE = ROOT / "bench" / ".cache"

_WAN_VAE = dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                temperal_downsample=[False, True, True], dropout=0.0)


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
        TinyWan(
            name="tiny",
            transformer=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
                             out_channels=4, text_dim=32, freq_dim=16, ffn_dim=32, num_layers=2,
                             cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=256),
            vae=dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                     temperal_downsample=[False, True, True], dropout=0.0),
        ),
        height=32, width=48, num_frames=9, steps=10, thresholds={"teacache": 0.3, "fbcache": 0.15},
    ),
    "mid": BenchSize(
        TinyWan(
            name="mid",
            transformer=dict(patch_size=(1, 2, 2), num_attention_heads=8, attention_head_dim=64, in_channels=16,
                             out_channels=16, text_dim=64, freq_dim=256, ffn_dim=1536, num_layers=14,
                             cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
            vae=dict(base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                     temperal_downsample=[False, True, True], dropout=0.0),
            text_encoder={"d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4,
                          "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
                          "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0},
        ),
        height=256, width=256, num_frames=17, steps=20, thresholds={"teacache": 0.6, "fbcache": 0.95},
    ),
    # Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json and vae/config.json; the text
    # encoder keeps UMT5-XXL's width (4096, what the DiT reads) but only 2 layers, since the
    # benchmark times the DiT and VAE, not prompt encoding.
    "real-1.3b": BenchSize(
        TinyWan(
            name="real-1.3b",
            transformer=dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                             out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30,
                             cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
            vae=_WAN_VAE,
            text_encoder={"d_model": 4096, "d_kv": 64, "d_ff": 1024, "num_layers": 2, "num_heads": 64,
                          "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
                          "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0},
        ),
        height=480, width=832, num_frames=33, steps=20, needs_cuda=True, thresholds={"teacache": 0.2, "fbcache": 0.1},
    ),
}


def ensure_checkpoint(size: str) -> Path:
    """The checkpoint folder for `size`, written (atomically) on first use."""
    spec = SIZES[size].spec
    folder = CACHE / spec.name
    if (folder / "model_index.json").exists():
        return folder
    partial = CACHE / f".{spec.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    write_tiny_wan(partial, spec)
    partial.rename(folder)
    return folder
