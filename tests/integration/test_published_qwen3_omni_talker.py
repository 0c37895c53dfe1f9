"""The corpus' scaled Qwen3-Omni-30B-A3B-Instruct talks when sampled.

transformers 5.25 never initialises the talker's experts (torch.empty) nor its routers (zeros); the corpus builder
(tests/helpers/published.py) wrote whatever memory held, and the talker's codec logits were NaN in some runs:
sampling failed, greedy's argmax hid it (transformers' own talker gave the same NaN on those weights). The builder
draws them now: every weight it writes is finite, out of float32 denormals, no router is all zero, and sampled
speech reads finite codec logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.published import build_scaled
from vidloom.families.qwen3_omni import speech_loops
from vidloom.generator import VideoGenerator

REPO = "Qwen/Qwen3-Omni-30B-A3B-Instruct"
SMALLEST_NORMAL = float(torch.finfo(torch.float32).tiny)
LARGEST = 10.0  # norms start at 1, drawn weights at std 0.02 or unit: garbage memory reached 1e38


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_scaled(REPO, tmp_path_factory.mktemp("q3-instruct"))


def test_every_written_weight_is_finite_normal_and_every_router_routes(folder):
    weights = {k: t for f in folder.glob("*.safetensors") for k, t in load_file(str(f)).items()}
    floats = {k: t.float() for k, t in weights.items() if t.is_floating_point()}
    assert any(".experts." in k for k in floats) and any(k.endswith("mlp.gate.weight") for k in floats)
    bad = [k for k, t in floats.items()
           if not torch.isfinite(t).all() or t.abs().max() > LARGEST or ((t != 0) & (t.abs() < SMALLEST_NORMAL)).any()]
    assert not bad, bad
    routers = [k for k, t in floats.items() if k.endswith("mlp.gate.weight") and t.ndim == 2]
    assert routers and all(floats[k].any() for k in routers)


def test_sampled_speech_reads_finite_codec_logits(folder, monkeypatch):
    seen: list[torch.Tensor] = []
    shape = speech_loops.shape_logits
    monkeypatch.setattr(speech_loops, "shape_logits", lambda logits, *a: seen.append(logits) or shape(logits, *a))
    gen = VideoGenerator.from_pretrained(folder, device="cpu", dtype="float32")
    try:
        for seed in range(3):
            speech = gen.speak("hello", max_audio_tokens=6, seed=seed)
            assert speech.audio.size > 0 and np.isfinite(speech.audio).all()
    finally:
        gen.close()
    assert len(seen) >= 3 and all(torch.isfinite(logits).all() for logits in seen)
