"""Acceleration options end to end on the tiny checkpoints: each against the plain path."""

from __future__ import annotations

import numpy as np
import pytest

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator

REQUEST = dict(prompt="a red fox jumps", negative_prompt="blurry", height=32, width=48, num_frames=9,
               num_inference_steps=6, guidance_scale=5.0, seed=11)


def _generator(folder, **deploy) -> VideoGenerator:
    return VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(**deploy))


def _video(gen: VideoGenerator, **changes) -> np.ndarray:
    return gen.engine.run(GenerationRequest(**{**REQUEST, **changes}))["video"]


@pytest.fixture(scope="module")
def plain(tiny_wan_dir) -> np.ndarray:
    return _video(_generator(tiny_wan_dir))


@pytest.mark.parametrize("cfg_mode", ["sequential", "batched"])
@pytest.mark.parametrize("policy", ["teacache", "fbcache"])
def test_threshold_zero_is_exactly_the_plain_path(tiny_wan_dir, plain, policy, cfg_mode):
    gen = _generator(tiny_wan_dir, step_cache=policy, step_cache_threshold=0.0, cfg_mode=cfg_mode)
    out = gen.run(GenerationRequest(**REQUEST))
    report = dict(out.metadata["step_cache"])
    if policy == "fbcache":  # a DBCache policy reports the settings it ran with
        assert report.pop("settings") == {"fn": 1, "bn": 0, "warmup": 1, "max_cached": -1, "max_continuous": -1,
                                          "taylorseer": 0}
    assert report == {"policy": policy, "threshold": 0.0, "skipped_steps": 0, "computed_steps": 6,
                      "skipped_blocks": 0, "total_blocks": report["total_blocks"]}
    video = _video(gen)
    if cfg_mode == "sequential":
        # Same ops in the same order as forward(), only called stage by stage.
        assert np.array_equal(video, plain)
    else:
        # Batched CFG's own fp32 difference (see tests/parity/test_batched_cfg.py); caching adds none.
        assert np.abs(video - plain).max() <= 1e-4
        assert np.array_equal(video, _video(_generator(tiny_wan_dir, cfg_mode="batched")))


@pytest.mark.parametrize("policy", ["teacache", "fbcache"])
def test_large_threshold_skips_steps_and_stays_finite(tiny_wan_dir, plain, policy):
    gen = _generator(tiny_wan_dir, step_cache=policy, step_cache_threshold=0.0)
    out = gen.run(GenerationRequest(**REQUEST, step_cache_threshold=1e6))  # per-request override
    report = out.metadata["step_cache"]
    # Step 1 has nothing to reuse; every later step reuses.
    assert (report["threshold"], report["skipped_steps"], report["computed_steps"]) == (1e6, 5, 1)
    num_blocks = gen.engine.instance["transformer"].num_blocks
    per_call = num_blocks if policy == "teacache" else num_blocks - 1
    assert report["total_blocks"] == 6 * 2 * num_blocks and report["skipped_blocks"] == 5 * 2 * per_call
    video = gen.engine.run(GenerationRequest(**REQUEST, step_cache_threshold=1e6))["video"]
    assert np.isfinite(video).all()
    assert np.abs(video - plain).max() > 1e-3


def test_interleaved_requests_keep_their_own_cache_state(tiny_wan_dir):
    # A threshold that makes both requests skip some steps but not all, so shared state would show.
    engine = _generator(tiny_wan_dir, step_cache="fbcache", step_cache_threshold=0.3).engine
    a = GenerationRequest(**REQUEST)
    b = GenerationRequest(**{**REQUEST, "prompt": "a blue whale", "seed": 5})
    alone = [engine.run(r) for r in (a, b)]
    runs = [engine.submit(a), engine.submit(b)]
    while not all(run.done for run in runs):
        for run in runs:
            run.step()
    together = [run.outputs() for run in runs]
    for solo, mixed in zip(alone, together):
        assert np.array_equal(solo["video"], mixed["video"])
        assert solo["step_cache"] == mixed["step_cache"]
    assert 0 < together[0]["step_cache"]["skipped_steps"] < 6, together[0]["step_cache"]


def test_threshold_without_a_deployed_cache_is_refused(tiny_wan_dir):
    with pytest.raises(InvalidRequest, match="step_cache_threshold"):
        _generator(tiny_wan_dir).engine.submit(GenerationRequest(**REQUEST, step_cache_threshold=0.1))
    with pytest.raises(InvalidRequest, match="step_cache_threshold: must be a number >= 0"):
        _generator(tiny_wan_dir, step_cache="teacache").engine.submit(
            GenerationRequest(**REQUEST, step_cache_threshold=-1))


@pytest.mark.parametrize(
    "deploy, message",
    [
        (dict(attention_backend="flash"), "'flash' needs a CUDA device"),
        (dict(attention_backend="sage"), "'sage' needs a CUDA device"),
        (dict(attention_backend="xformers"), "known: sdpa, math, flash, sage"),
        (dict(cfg_mode="parallel"), "known: sequential, batched"),
        (dict(step_cache="tea"), "known: none, teacache, fbcache"),
    ],
)
def test_unusable_options_fail_at_load(tiny_wan_dir, deploy, message):
    with pytest.raises(DeployError, match=message):
        _generator(tiny_wan_dir, **deploy)
