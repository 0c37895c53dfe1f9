"""CUDA graphs of the step body for every family that declares them, driven on CPU by the stand-in capturer.

The capturer (tests/helpers/graph_capturer.py) keeps a CUDA graph's contract: the step is recorded once over
static inputs, and each replay recomputes the outputs from whatever the static buffers then hold. So a request
whose per-request tensors (reference tokens, duration token, camera, positions, CLIP tokens, text) did not reach
the static buffers would replay the first request's and differ from its plain run. Per family: a first request
captures and replays every step, a second of the same signature (other prompt, seed and conditioning) replays
without a capture, and a changed signature (size, or CFG off where every request has one size) captures anew;
every output equals the plain run's. The kernels themselves are captured in tests/gpu/test_cuda_graph_families.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from tests.helpers.flux2_checkpoints import TINY_BASE, write_tiny_flux2
from tests.helpers.graph_capturer import RecordingCapturer
from tests.helpers.ltx2_checkpoints import CONFIGS as LTX2_CONFIGS, write_tiny_ltx2
from tests.helpers.sana_wm_checkpoints import SANA_WM_A, write_tiny_sana_wm
from tests.helpers.stable_audio_checkpoints import CONFIGS as STABLE_AUDIO_CONFIGS, write_tiny_stable_audio
from tests.helpers.wan_checkpoints import TINY_A
from tests.helpers.wan_i2v_checkpoints import make_image, write_tiny_wan_i2v
from vidloom.generator import VideoGenerator
from vidloom.runtime.engine import Engine

WRITERS: dict[str, Callable[[Path], Path]] = {
    "flux2": lambda d: write_tiny_flux2(d, TINY_BASE),
    "stable-audio": lambda d: write_tiny_stable_audio(d, STABLE_AUDIO_CONFIGS[0]),
    "sana-wm": lambda d: write_tiny_sana_wm(d, SANA_WM_A),
    "ltx2": lambda d: write_tiny_ltx2(d, LTX2_CONFIGS[0]),
    "wan-i2v-clip": lambda d: write_tiny_wan_i2v(d, TINY_A),
}
STEPS = 2


def _requests(kind: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(first, same signature with other values, changed signature) generate() keywords."""
    base = dict(negative_prompt="blurry", num_inference_steps=STEPS)
    if kind == "flux2":  # reference images: their tokens are per-request tensors of the network view
        first = dict(prompt="make it purple", image=make_image(64, 64, 1), seed=1, guidance_scale=4.0)
        second = dict(prompt="make it yellow", image=make_image(64, 64, 2), seed=2, guidance_scale=3.0)
        changed = dict(prompt="make it purple", height=32, width=48, seed=1, guidance_scale=4.0)
    elif kind == "stable-audio":  # every request runs the model's one window: CFG off changes the signature
        first = dict(prompt="a red fox jumps", seed=1, guidance_scale=3.0, seconds=0.5)
        second = dict(prompt="a blue cat naps", seed=2, guidance_scale=5.0, seconds=0.5, seconds_start=0.25)
        changed = dict(prompt="a red fox jumps", seed=1, guidance_scale=1.0, seconds=0.5)
    elif kind == "sana-wm":  # the camera (intrinsics) is a per-request tensor of the network view
        shape = dict(height=64, width=96, num_frames=17, camera="jw-16")
        first = dict(prompt="a red fox jumps", image=make_image(70, 40, 1), intrinsics=[50.0, 52.0, 35.0, 20.0],
                     seed=1, guidance_scale=3.0, **shape)
        second = dict(prompt="a blue cat naps", image=make_image(70, 40, 2), intrinsics=[44.0, 47.0, 30.0, 22.0],
                      seed=2, guidance_scale=4.5, **shape)
        changed = {**first, "width": 64}
    elif kind == "ltx2":  # fps moves the video positions (seconds): a per-request tensor of the network view
        first = dict(prompt="a red fox jumps", height=64, width=64, num_frames=9, fps=25, seed=1, guidance_scale=3.0)
        second = dict(prompt="a blue cat naps", height=64, width=64, num_frames=9, fps=24, seed=2, guidance_scale=3.0)
        changed = {**first, "width": 96}
    else:  # wan-i2v-clip: the CLIP tokens of the image are per-request tensors of the network view
        first = dict(prompt="a red fox jumps", image=make_image(60, 41, 1), height=32, width=48, num_frames=5,
                     seed=1, guidance_scale=5.0)
        second = dict(prompt="a blue cat naps", image=make_image(60, 41, 2), height=32, width=48, num_frames=5,
                      seed=2, guidance_scale=4.0)
        changed = {**first, "height": 48, "width": 16, "image": make_image(16, 48, 1)}
    return tuple({**base, **r} for r in (first, second, changed))  # type: ignore[return-value]


def _graphed(plain: VideoGenerator, capturer: RecordingCapturer) -> VideoGenerator:
    """The same loaded model with cuda_graphs on, its steps recorded by `capturer` (the CUDA check is skipped: the
    card's acceptance of cuda_graphs is checked below and at load in test_capability_audit)."""
    engine = plain.engine
    deploy = dataclasses.replace(engine.instance.deploy, cuda_graphs=True)
    instance = dataclasses.replace(engine.instance, deploy=deploy)
    return VideoGenerator(Engine(instance, engine.program, engine.adapters, capturer=capturer))


def _result(gen: VideoGenerator, fields: dict[str, Any]) -> np.ndarray:
    """The output's frames and waveform (LTX-2 has both, Stable Audio only sound) as one float64 vector."""
    fields = dict(fields)
    out = gen.generate(fields.pop("prompt"), **fields)
    parts = [out.frames.astype(np.float64).ravel()]
    if out.audio is not None:
        parts.append(out.audio.astype(np.float64).ravel())
    result = np.concatenate(parts)
    assert result.size > 0
    return result


@pytest.fixture(scope="module", params=sorted(WRITERS))
def family(request, tmp_path_factory) -> tuple[str, VideoGenerator]:
    kind = request.param
    if kind == "stable-audio":
        pytest.importorskip("torchsde")
    folder = WRITERS[kind](tmp_path_factory.mktemp(f"graphs-{kind}") / kind)
    return kind, VideoGenerator.from_pretrained(folder, device="cpu")


def test_replayed_steps_equal_the_plain_run(family):
    kind, plain = family
    assert "cuda_graphs" in plain.card.capabilities.supported, plain.card.capabilities.why_not.get("cuda_graphs")
    capturer = RecordingCapturer()
    graphed = _graphed(plain, capturer)
    first, second, changed = _requests(kind)
    expected = [(1, STEPS), (1, 2 * STEPS), (2, 3 * STEPS)]  # (captures, replays) after each request
    for fields, (captures, replays) in zip((first, second, changed), expected):
        want, got = _result(plain, fields), _result(graphed, fields)
        # The stand-in replays the same ops over the same values; the guidance scale, a 0-dim float32 buffer in
        # the graph, multiplies exactly as the eager float does (diffusion.guidance.cfg_combine): bit-equal.
        assert got.shape == want.shape and np.array_equal(got, want), (kind, fields["prompt"])
        stats = graphed.engine.graph_stats
        assert (stats["captures"], stats["replays"], stats["fallbacks"]) == (captures, replays, 0), (kind, stats)
        assert capturer.calls == captures
    # The second request's own conditioning reached its steps (else the replay would have matched the first's).
    assert not np.array_equal(_result(plain, first), _result(plain, second))
