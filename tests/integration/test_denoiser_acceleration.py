"""Step caches and compile via the denoiser contract (LTX-2, FAR, Cosmos3, SANA-WM, Stable Audio) vs the plain path.

Each family only declares its staged denoiser (embed -> blocks -> head) and its compile units; the
runtime's one step cache and one compile path act on them. Measured on these tiny random checkpoints
(PSNR of the uint8 frames against the plain run; random weights change a lot from step to step, so
skipping costs more dB than on real checkpoints):

| family  | steps | fbcache (threshold) skipped, PSNR | teacache (threshold) skipped, PSNR |
|---------|-------|-----------------------------------|------------------------------------|
| LTX-2   | 8     | (0.7) 5 steps, 19.7 dB            | (0.7) 2 steps, 26.3 dB             |
| FAR     | 2x4   | (1.0) 2 steps, 35.9 dB            | (1.0) 2 steps, 33.5 dB             |
| Cosmos3 | 8     | (0.3) 5 steps, 48.1 dB            | (0.3) 6 steps, 42.5 dB             |
| SANA-WM | 4     | (0.1) 3 steps, 55.7 dB            | (0.3) 1 step, 62.4 dB              |
| Stable Audio | 8   | (0.7) 1 step, 46.2 dB             | (0.7) 1 step, 42.3 dB              |

Stable Audio's figure is the waveform's PSNR against the plain run's peak amplitude. SANA-WM's step cache
and compile act on stage 1 (its refiner's windowed forward is not staged: see families/sana_wm/cards.py).

compile runs with backend aot_eager (inductor would generate C++ kernels for minutes on this CPU): it
traces the same aten ops as eager, so the outputs equal the plain path within float32 noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch._dynamo
from PIL import Image

from tests.helpers.cosmos3_action_checkpoints import write_tiny_cosmos3_action
from tests.helpers.cosmos3_checkpoints import COSMOS3_A, write_tiny_cosmos3
from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from tests.helpers.ltx2_checkpoints import CONFIGS as LTX2_CONFIGS, write_tiny_ltx2
from tests.helpers.sana_wm_checkpoints import SANA_WM_A, write_tiny_sana_wm
from tests.helpers.stable_audio_checkpoints import CONFIGS as STABLE_AUDIO_CONFIGS, write_tiny_stable_audio
from vidloom import ActionInput
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator

WRITERS: dict[str, Callable[[Path], Path]] = {
    "ltx2": lambda d: write_tiny_ltx2(d, LTX2_CONFIGS[0]),
    "far": lambda d: write_tiny_far(d, FAR_A),
    "cosmos3": lambda d: write_tiny_cosmos3(d, COSMOS3_A),
}
REQUESTS: dict[str, dict[str, Any]] = {
    "ltx2": dict(height=64, width=64, num_frames=9, fps=25, num_inference_steps=8, guidance_scale=3.0),
    "far": dict(height=32, width=48, num_frames=9, num_inference_steps=4, guidance_scale=3.0),
    "cosmos3": dict(height=32, width=32, num_frames=9, num_inference_steps=8, guidance_scale=3.0, fps=16),
}
# (threshold that skips steps, least PSNR in dB: the measured value above less ~3 dB) per family and policy.
SKIPPING: dict[tuple[str, str], tuple[float, float]] = {
    ("ltx2", "fbcache"): (0.7, 16.5), ("ltx2", "teacache"): (0.7, 23.0),
    ("far", "fbcache"): (1.0, 32.5), ("far", "teacache"): (1.0, 30.5),
    ("cosmos3", "fbcache"): (0.3, 45.0), ("cosmos3", "teacache"): (0.3, 39.5),
}
TOTAL_STEPS = {"ltx2": 8, "far": 8, "cosmos3": 8}  # FAR: 2 generated chunks x 4 steps


def _request(kind: str) -> GenerationRequest:
    return GenerationRequest(prompt="a red fox jumps", negative_prompt="blurry", seed=3, **REQUESTS[kind])


def _generator(folder: Path, **deploy: Any) -> VideoGenerator:
    return VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(**deploy))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module", params=sorted(WRITERS))
def family(request, tmp_path_factory) -> tuple[str, Path, Any]:
    kind = request.param
    folder = WRITERS[kind](tmp_path_factory.mktemp(f"denoiser-{kind}"))
    return kind, folder, _generator(folder).run(_request(kind))


@pytest.mark.parametrize("policy", ["fbcache", "teacache"])
def test_threshold_zero_runs_every_block_and_equals_the_plain_path(family, policy):
    kind, folder, plain = family
    out = _generator(folder, step_cache=policy, step_cache_threshold=0.0).run(_request(kind))
    report = out.metadata["step_cache"]
    assert (report["skipped_steps"], report["computed_steps"], report["skipped_blocks"]) == (0, TOTAL_STEPS[kind], 0)
    assert report["total_blocks"] > 0
    # The staged path runs the same ops in the same order as the network's call.
    assert np.array_equal(out.frames, plain.frames)


@pytest.mark.parametrize("policy", ["fbcache", "teacache"])
def test_a_threshold_skips_steps_and_stays_close(family, policy):
    kind, folder, plain = family
    threshold, least_db = SKIPPING[(kind, policy)]
    out = _generator(folder, step_cache=policy, step_cache_threshold=threshold).run(_request(kind))
    report = out.metadata["step_cache"]
    assert report["skipped_steps"] > 0 and report["skipped_blocks"] > 0, report
    assert not np.array_equal(out.frames, plain.frames)  # the output moves
    value = psnr(out.frames, plain.frames)
    print(f"{kind} {policy} threshold {threshold}: {report['skipped_steps']} steps skipped, {value:.1f} dB")
    assert value > least_db, (report, value)


def test_compile_equals_eager(family):
    kind, folder, plain = family
    torch._dynamo.reset()
    try:
        gen = _generator(folder, compile=True, compile_backend="aot_eager")
        blocks = [m for c in gen.engine.instance.components.values() if isinstance(c, torch.nn.Module)
                  for m in c.modules() if getattr(m, "_compiled_call_impl", None) is not None]
        assert blocks, "no block was compiled"
        out = gen.engine.run(_request(kind))["video"]
    finally:
        torch._dynamo.reset()
    eager = _generator(folder).engine.run(_request(kind))["video"]
    # aot_eager traces the same aten ops as eager; decompositions may reorder a float32 sum (<= 1e-5 seen 0).
    assert np.abs(np.asarray(out, dtype=np.float64) - np.asarray(eager, dtype=np.float64)).max() <= 1e-5


def test_far_keeps_each_chunks_residuals_apart(tmp_path):
    # With an unbounded threshold every step that can reuse does: only the first step of each chunk computes,
    # because a chunk's residual is never reused for the next chunk (the network's cache scope).
    folder = WRITERS["far"](tmp_path / "far")
    out = _generator(folder, step_cache="fbcache", step_cache_threshold=1e9).run(_request("far"))
    report = out.metadata["step_cache"]
    assert (report["computed_steps"], report["skipped_steps"]) == (2, 6), report


# -- Cosmos3's action tokens ride the same residual stream (after vision and sound) -----------------------------


def _policy_request() -> GenerationRequest:
    """A policy run (first frame -> video + actions): the head's action velocity is what the run returns."""
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8))
    action = ActionInput(mode="policy", domain_name="pusht", chunk_size=4, resolution_tier=256)
    return GenerationRequest(prompt="the arm pushes the block", negative_prompt="blurry", seed=4, image=(image,),
                             num_inference_steps=3, guidance_scale=3.0, action=action)


@pytest.fixture(scope="module")
def action_run(tmp_path_factory) -> tuple[Path, Any]:
    folder = write_tiny_cosmos3_action(tmp_path_factory.mktemp("denoiser-cosmos3-action") / "tiny-cosmos3-action")
    return folder, _generator(folder).run(_policy_request())


def test_cosmos3_actions_through_a_step_cache(action_run):
    folder, plain = action_run
    assert plain.actions is not None and plain.actions.shape == (4, 2)
    exact = _generator(folder, step_cache="fbcache", step_cache_threshold=0.0).run(_policy_request())
    assert exact.metadata["step_cache"]["skipped_steps"] == 0
    assert np.array_equal(exact.frames, plain.frames) and np.array_equal(exact.actions, plain.actions)
    # Every step after the first reuses the blocks' residual, action tokens included: the actions still come
    # back at the embodiment's width, finite, and move with the skipped blocks.
    skipped = _generator(folder, step_cache="fbcache", step_cache_threshold=1e9).run(_policy_request())
    assert (skipped.metadata["step_cache"]["computed_steps"], skipped.metadata["step_cache"]["skipped_steps"]) == (1, 2)
    assert skipped.actions.shape == (4, 2) and np.isfinite(skipped.actions).all()
    assert not np.array_equal(skipped.actions, plain.actions)


def test_cosmos3_actions_compile_equals_eager(action_run):
    folder, plain = action_run
    torch._dynamo.reset()
    try:
        out = _generator(folder, compile=True, compile_backend="aot_eager").run(_policy_request())
    finally:
        torch._dynamo.reset()
    # aot_eager traces the same aten ops as eager (see test_compile_equals_eager): float32 noise at most.
    assert np.abs(out.actions.astype(np.float64) - plain.actions.astype(np.float64)).max() <= 1e-5
    assert np.abs(out.frames.astype(int) - plain.frames.astype(int)).max() <= 1


# -- Stable Audio (a waveform) and SANA-WM stage 1 (camera-conditioned I2V) --------------------------------------

SANA_IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 70, 3), dtype=np.uint8))
MORE_WRITERS: dict[str, Callable[[Path], Path]] = {
    "stable-audio": lambda d: write_tiny_stable_audio(d, STABLE_AUDIO_CONFIGS[0]),
    "sana-wm": lambda d: write_tiny_sana_wm(d, SANA_WM_A),
}
MORE_REQUESTS: dict[str, dict[str, Any]] = {
    "stable-audio": dict(num_inference_steps=8, guidance_scale=3.0),
    "sana-wm": dict(height=64, width=96, num_frames=17, num_inference_steps=4, guidance_scale=3.0, image=SANA_IMAGE,
                    intrinsics=[50.0, 52.0, 35.0, 20.0], camera="jw-16"),
}
# (threshold that skips steps, least PSNR in dB: the measured value in the table above less ~3 dB).
MORE_SKIPPING: dict[tuple[str, str], tuple[float, float]] = {
    ("stable-audio", "fbcache"): (0.7, 43.0), ("stable-audio", "teacache"): (0.7, 39.0),
    ("sana-wm", "fbcache"): (0.1, 52.5), ("sana-wm", "teacache"): (0.3, 59.0),
}


def _run_more(kind: str, folder: Path, **deploy: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """(the waveform [channels, samples] or the uint8 frames, the output's metadata)."""
    gen, fields = _generator(folder, **deploy), dict(negative_prompt="blurry", seed=3, **MORE_REQUESTS[kind])
    if kind == "stable-audio":
        out = gen.generate("a red fox jumps", **fields)
        return out.audio, out.metadata
    out = gen.run(GenerationRequest(prompt="a red fox jumps", **fields))
    return out.frames, out.metadata


def _peak(kind: str, plain: np.ndarray) -> float:
    return float(np.abs(plain).max()) if kind == "stable-audio" else 255.0


@pytest.fixture(scope="module", params=sorted(MORE_WRITERS))
def more_family(request, tmp_path_factory) -> tuple[str, Path, np.ndarray]:
    kind = request.param
    if kind == "stable-audio":
        pytest.importorskip("torchsde")
    folder = MORE_WRITERS[kind](tmp_path_factory.mktemp(f"denoiser-{kind}"))
    return kind, folder, _run_more(kind, folder)[0]


@pytest.mark.parametrize("policy", ["fbcache", "teacache"])
def test_more_families_step_cache(more_family, policy):
    kind, folder, plain = more_family
    exact, meta = _run_more(kind, folder, step_cache=policy, step_cache_threshold=0.0)
    report = meta["step_cache"]
    assert report["skipped_steps"] == 0 and report["skipped_blocks"] == 0 and report["total_blocks"] > 0
    assert np.array_equal(exact, plain)  # the staged path runs the network's ops in its order
    threshold, least_db = MORE_SKIPPING[(kind, policy)]
    out, meta = _run_more(kind, folder, step_cache=policy, step_cache_threshold=threshold)
    report = meta["step_cache"]
    assert report["skipped_steps"] > 0, report
    value = psnr(out / _peak(kind, plain) * 255.0, plain / _peak(kind, plain) * 255.0)
    print(f"{kind} {policy} threshold {threshold}: {report['skipped_steps']} steps skipped, {value:.1f} dB")
    assert not np.array_equal(out, plain) and value > least_db, (report, value)


def test_more_families_compile_equals_eager(more_family):
    kind, folder, plain = more_family
    torch._dynamo.reset()
    try:
        out, _ = _run_more(kind, folder, compile=True, compile_backend="aot_eager")
    finally:
        torch._dynamo.reset()
    # aot_eager traces the same aten ops as eager: float32 noise at most (waveform units, or uint8 levels).
    bound = 1e-5 if kind == "stable-audio" else 1
    assert np.abs(out.astype(np.float64) - plain.astype(np.float64)).max() <= bound
