"""Step caches on Flux2 through its staged denoiser (embed -> blocks -> head): against the plain path."""

from __future__ import annotations

import numpy as np
import pytest

from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator

REQUEST = dict(prompt="a red fox in the snow", negative_prompt="blurry", task=Task.T2I, height=32, width=48,
               num_inference_steps=8, guidance_scale=4.0, seed=7)


def _generator(folder, **deploy) -> VideoGenerator:
    return VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(**deploy))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    from tests.helpers.flux2_checkpoints import TINY_BASE, write_tiny_flux2

    return write_tiny_flux2(tmp_path_factory.mktemp("flux2-step-cache"), TINY_BASE)


@pytest.fixture(scope="module")
def plain(base_dir) -> np.ndarray:
    return _generator(base_dir).generate(**{k: v for k, v in REQUEST.items() if k != "task"}).frames


@pytest.mark.parametrize("cfg_mode", ["sequential", "batched"])
@pytest.mark.parametrize("policy", ["fbcache", "teacache"])
def test_threshold_zero_runs_every_block_and_equals_the_plain_path(base_dir, plain, policy, cfg_mode):
    gen = _generator(base_dir, step_cache=policy, step_cache_threshold=0.0, cfg_mode=cfg_mode)
    out = gen.run(GenerationRequest(**REQUEST))
    report = out.metadata["step_cache"]
    assert report["skipped_steps"] == 0 and report["computed_steps"] == 8 and report["skipped_blocks"] == 0
    if cfg_mode == "sequential":
        # The staged path runs the same ops in the same order as forward(): identical images.
        assert np.array_equal(out.frames, plain)
    else:
        # One forward of batch 2 vs two of batch 1: matmul blocking only (one uint8 level at most).
        assert np.abs(out.frames.astype(int) - plain.astype(int)).max() <= 1


@pytest.mark.parametrize("policy", ["fbcache", "teacache"])
def test_a_threshold_skips_steps_and_stays_close(base_dir, plain, policy):
    # A random-weight model changes a lot from step to step, so it takes a high threshold to skip at all.
    gen = _generator(base_dir, step_cache=policy, step_cache_threshold=1.0)
    out = gen.run(GenerationRequest(**REQUEST))
    report = out.metadata["step_cache"]
    assert report["skipped_steps"] > 0 and report["skipped_blocks"] > 0, report
    assert out.frames.shape == plain.shape and not np.array_equal(out.frames, plain)  # the output moves
    # Measured on the tiny random Klein (8 steps, threshold 1.0): fbcache skips 2 steps, 47.4 dB;
    # teacache (raw relative L1 of block 0's modulated input) skips 3, 33.8 dB.
    assert psnr(out.frames, plain) > 25


def test_each_request_keeps_its_own_cache_state(base_dir):
    gen = _generator(base_dir, step_cache="fbcache", step_cache_threshold=1.0)
    first = gen.run(GenerationRequest(**REQUEST))
    gen.run(GenerationRequest(**{**REQUEST, "prompt": "a blue boat", "seed": 1}))
    again = gen.run(GenerationRequest(**REQUEST))
    assert np.array_equal(first.frames, again.frames)
    assert first.metadata["step_cache"] == again.metadata["step_cache"]
