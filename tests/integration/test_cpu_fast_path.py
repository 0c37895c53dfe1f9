"""The CPU fast path's quality gate: each family's demo, generated with the runtime's default dtype on a CPU
with native bf16 (the probe is mocked, so the gate runs on any CPU), stays >= 35 dB PSNR against the float32
render of the same request, and dtype="float32" still loads float32 for exact parity.

Measured at these sizes: 48.3 (cosmos3) to 58.9 dB (flux2); docs/performance-cpu.md lists the demo defaults.
The Wan-VAE families (Wan2.1, Wan2.2, FAR, Cosmos3) decode in bfloat16 on the fast path too. Qwen-Omni's
speech (bfloat16 thinker and talker, float32 token2wav) is gated by waveform SNR, at the same 35 dB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vidloom.generator import VideoGenerator
from vidloom.loading import precision
from vidloom.parity.quality import FAST_PATH_MIN_PSNR_DB, psnr, waveform_snr

pytestmark = pytest.mark.cpu_fast_path

# Smaller than the demos' defaults where a family allows it: the gate is about arithmetic, not size.
REQUESTS = {
    "wan2.1-demo": {"height": 64, "width": 64, "num_frames": 5, "num_inference_steps": 4},
    "wan2.2-demo": {"num_inference_steps": 4},
    "far-demo": {"num_frames": 9},
    "flux2-klein-demo": {},
    "ltx2-demo": {"height": 64, "width": 64},
    "cosmos3-demo": {"num_inference_steps": 4},
    # Measured 51.9 dB (2 steps).
    "sana-wm-demo": {"camera": "w-8,jw-8", "intrinsics": [100.0, 100.0, 80.0, 60.0], "num_inference_steps": 2,
                     "image": "first-frame"},
}


def _first_frame() -> Image.Image:
    return Image.fromarray((np.random.default_rng(0).random((64, 96, 3)) * 255).astype(np.uint8))


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fast-path-demos")


@pytest.mark.parametrize("demo", list(REQUESTS))
def test_default_fast_path_stays_within_the_psnr_gate(demo, demo_cache, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    request = {"seed": 3, **REQUESTS[demo]}
    if request.get("image") == "first-frame":
        request["image"] = _first_frame()
    fast = VideoGenerator.from_pretrained(demo, device="cpu", cache_dir=demo_cache)
    assert fast.engine.instance.dtype is torch.bfloat16
    exact = VideoGenerator.from_pretrained(demo, device="cpu", dtype="float32", cache_dir=demo_cache)
    assert exact.engine.instance.dtype is torch.float32
    ours = fast.generate("a red fox jumps over a frozen river", **request).frames
    reference = exact.generate("a red fox jumps over a frozen river", **request).frames
    assert psnr(ours, reference) >= FAST_PATH_MIN_PSNR_DB, f"{demo}: {psnr(ours, reference):.1f} dB"


def test_speech_fast_path_stays_within_the_snr_gate(demo_cache, monkeypatch):
    """Thinker and talker in bfloat16 pick the same greedy codes here (measured: 337 dB, i.e. the same codes);
    token2wav stays float32 (the reference runs it in float32 only)."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    fast = VideoGenerator.from_pretrained("qwen-omni-demo", device="cpu", cache_dir=demo_cache)
    assert fast.engine.instance.dtype is torch.bfloat16
    dit, vocoder = fast.engine.instance.components["token2wav"]
    assert next(dit.parameters()).dtype is torch.float32 and next(vocoder.parameters()).dtype is torch.float32
    exact = VideoGenerator.from_pretrained("qwen-omni-demo", device="cpu", dtype="float32", cache_dir=demo_cache)
    ours, reference = (np.asarray(g.speak("Hello there, how are you today?", greedy=True, seed=3).audio)
                       for g in (fast, exact))
    assert waveform_snr(ours, reference) >= FAST_PATH_MIN_PSNR_DB, f"{waveform_snr(ours, reference):.1f} dB"


def test_the_bf16_fast_path_decodes_the_wan_vae_in_bf16_and_float32_keeps_it_exact(demo_cache, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    fast = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache)
    exact = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", dtype="float32", cache_dir=demo_cache)
    assert next(fast.engine.instance["vae"].parameters()).dtype is torch.bfloat16
    assert next(exact.engine.instance["vae"].parameters()).dtype is torch.float32


def test_the_bf16_fast_path_decodes_ltx2_video_in_bf16_channels_last_and_its_audio_in_float32(demo_cache, monkeypatch):
    """LTX-2's video VAE follows the fast path (57 dB PSNR on bench's ltx2-mid, 3x faster with channels-last
    weights); its audio VAE and vocoder stay float32 (bfloat16 measured no faster); float32 keeps all three."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    fast = VideoGenerator.from_pretrained("ltx2-demo", device="cpu", cache_dir=demo_cache)
    exact = VideoGenerator.from_pretrained("ltx2-demo", device="cpu", dtype="float32", cache_dir=demo_cache)
    conv = next(m for m in fast.engine.instance["vae"].modules() if isinstance(m, torch.nn.Conv3d))
    assert conv.weight.dtype is torch.bfloat16
    assert conv.weight.is_contiguous(memory_format=torch.channels_last_3d)
    for name in ("audio_vae", "vocoder"):
        assert next(fast.engine.instance[name].parameters()).dtype is torch.float32
    assert next(exact.engine.instance["vae"].parameters()).dtype is torch.float32
