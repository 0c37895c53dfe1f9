"""The CPU fast path's quality gate: each family's demo, generated with the runtime's default dtype on a CPU
with native bf16 (the probe is mocked, so the gate runs on any CPU), stays >= 35 dB PSNR against the float32
render of the same request, and dtype="float32" still loads float32 for exact parity.

Measured at these sizes: 48.3 (cosmos3) to 58.9 dB (flux2); docs/performance-cpu.md lists the demo defaults.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vidloom.generator import VideoGenerator
from vidloom.loading import precision
from vidloom.parity.quality import FAST_PATH_MIN_PSNR_DB, psnr

pytestmark = pytest.mark.cpu_fast_path

# Smaller than the demos' defaults where a family allows it: the gate is about arithmetic, not size.
REQUESTS = {
    "wan2.1-demo": {"height": 64, "width": 64, "num_frames": 5, "num_inference_steps": 4},
    "wan2.2-demo": {"num_inference_steps": 4},
    "far-demo": {"num_frames": 9},
    "flux2-klein-demo": {},
    "ltx2-demo": {"height": 64, "width": 64},
    "cosmos3-demo": {"num_inference_steps": 4},
}


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fast-path-demos")


@pytest.mark.parametrize("demo", list(REQUESTS))
def test_default_fast_path_stays_within_the_psnr_gate(demo, demo_cache, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    request = {"seed": 3, **REQUESTS[demo]}
    fast = VideoGenerator.from_pretrained(demo, device="cpu", cache_dir=demo_cache)
    assert fast.engine.instance.dtype is torch.bfloat16
    exact = VideoGenerator.from_pretrained(demo, device="cpu", dtype="float32", cache_dir=demo_cache)
    assert exact.engine.instance.dtype is torch.float32
    ours = fast.generate("a red fox jumps over a frozen river", **request).frames
    reference = exact.generate("a red fox jumps over a frozen river", **request).frames
    assert psnr(ours, reference) >= FAST_PATH_MIN_PSNR_DB, f"{demo}: {psnr(ours, reference):.1f} dB"
