"""Cross-request batching of LTX-2 steps: the plan declares its per-sample inputs (runtime.batching), and the
network's batch key is the request's token positions (video and audio coordinates follow size, frames and fps).

Batched and single forwards differ only by matmul blocking over the batch, so the bound is 1e-5 of the magnitude
on the step velocities and the decoded waveform (as for Wan and Flux2 in test_batching.py; uint8 frames: one level).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.ltx2_checkpoints import CONFIGS as LTX2_CONFIGS, write_tiny_ltx2
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime.async_engine import AsyncEngine
from vidloom.runtime.batching import batch_key, run_batched
from vidloom.runtime.results import video_output

RTOL = 1e-5
UINT8_TOLERANCE = 1
SIZE = dict(height=64, width=64, num_frames=9, fps=25, guidance_scale=3.0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = write_tiny_ltx2(tmp_path_factory.mktemp("ltx2-batch"), LTX2_CONFIGS[0])
    return VideoGenerator.from_pretrained(folder, device="cpu").engine


def _requests() -> list[GenerationRequest]:
    """Two requests of one shape (different prompts, seeds, step counts) and one of another size."""
    return [GenerationRequest(prompt="a red fox jumps", negative_prompt="blurry", seed=1, num_inference_steps=3, **SIZE),
            GenerationRequest(prompt="rain on a lake", negative_prompt="blurry", seed=2, num_inference_steps=4, **SIZE),
            GenerationRequest(prompt="a boat", negative_prompt="blurry", seed=3, num_inference_steps=3,
                              **{**SIZE, "width": 96})]


def _first_plans(engine, requests):
    runs = [engine.submit(r) for r in requests]
    plans = []
    for run in runs:
        while not run.prepare():
            pass
        plans.append(run.pending_plan)
    return runs, plans


def _close(result, alone) -> bool:
    return all((r - a).abs().max() <= RTOL * a.abs().max() for r, a in zip(result, alone))


def test_keys_follow_the_positions(engine):
    requests = _requests()
    requests.append(GenerationRequest(prompt="a cat", negative_prompt="blurry", seed=4, num_inference_steps=3,
                                      **{**SIZE, "fps": 12}))
    runs, plans = _first_plans(engine, requests)
    try:
        keys = [batch_key(p) for p in plans]
        assert all(k is not None for k in keys)
        assert keys[0] == keys[1]  # same size, frames and fps: one forward
        assert keys[2] != keys[0]  # another size: other video positions
        assert keys[3] != keys[0]  # another fps: other video and audio coordinates
        with torch.inference_mode():
            together = run_batched(plans[:2])
            for plan, result in zip(plans[:2], together):
                alone = plan.call(**plan.inputs)
                assert isinstance(result, tuple) and len(result) == 2  # video and audio velocities
                assert result[0].shape == alone[0].shape and result[1].shape == alone[1].shape
                assert _close(result, alone)
    finally:
        for run in runs:
            run.close()


def test_concurrent_requests_equal_their_single_runs(engine):
    requests = _requests()
    expected = [video_output(engine.instance.card, engine.run(r)) for r in requests]
    async_engine = AsyncEngine(engine, policy="batch", slots=len(requests), queue_size=8)
    try:
        handles = [async_engine.submit(r) for r in requests]
        got = [h.wait(300) for h in handles]
        stats = async_engine.batch_stats
    finally:
        async_engine.close()
    assert stats["largest_batch"] == 2  # the two same-shape requests shared forwards; the third ran alone
    for e, g in zip(expected, got):
        assert np.abs(e.frames.astype(int) - g.frames.astype(int)).max() <= UINT8_TOLERANCE
        assert e.audio is not None and g.audio is not None and e.audio.shape == g.audio.shape
        assert np.abs(e.audio - g.audio).max() <= RTOL * max(np.abs(e.audio).max(), 1e-6)
    assert not np.array_equal(expected[0].frames, expected[1].frames)
