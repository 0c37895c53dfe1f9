"""Cross-request batching of Stable Audio steps: every request runs the model's one window, so requests share a
forward whatever their prompts, seconds (the duration token stacks), seeds, step counts and guidance scales.

Batched and single forwards differ only by matmul blocking over the batch (float32 demo): the bound is 1e-5 of the
magnitude on a step's output, as for Wan, Flux2 and LTX-2 (test_batching.py); WAVE_RTOL on the decoded waveform.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.batched_runs import assert_batched_equals_single, first_plans, serve_batched
from vidloom.families.stable_audio.demo import DEMO_ID, ensure_demo_checkpoint
from vidloom.generator import VideoGenerator, build_request
from vidloom.runtime.batching import batch_key
from vidloom.runtime.results import video_output

pytest.importorskip("torchsde")

RTOL = 1e-5
# On the waveform those step differences compound: guidance up to 7 scales them, over 3-4 second-order SDE steps and
# the Oobleck decoder; observed up to 1e-4 of the magnitude (a wrong duration token or row shifts it by ~1e-1).
WAVE_RTOL = 5e-4


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    cache = tmp_path_factory.mktemp("stable-audio-batch")
    ensure_demo_checkpoint(cache)
    return VideoGenerator.from_pretrained(DEMO_ID, device="cpu", cache_dir=cache).engine


def _requests(engine, **cfg) -> list:
    kinds = [dict(prompt="a dog barks", seed=1, num_inference_steps=3, guidance_scale=7.0, seconds=0.5),
             dict(prompt="rain on a roof", seed=2, num_inference_steps=4, guidance_scale=4.0, seconds=0.75,
                  seconds_start=0.25),
             dict(prompt="a bell rings", seed=3, num_inference_steps=3, guidance_scale=7.0, seconds=0.75)]
    return [build_request(engine.instance.card, negative_prompt="hiss", **{**k, **cfg}) for k in kinds]


def test_a_batched_step_equals_the_single_steps(engine):
    with first_plans(engine, _requests(engine)) as plans:
        keys = [batch_key(p) for p in plans]
        assert keys[0] is not None and len(set(keys)) == 1  # other seconds: the duration token stacks
        assert_batched_equals_single(plans, RTOL)


def test_requests_with_and_without_cfg_do_not_share_a_forward(engine):
    with first_plans(engine, [*_requests(engine)[:1], *_requests(engine, guidance_scale=1.0)[:1]]) as plans:
        assert batch_key(plans[0]) != batch_key(plans[1])  # one has a negative branch, the other none


def test_concurrent_requests_equal_their_single_runs(engine):
    requests = _requests(engine)
    expected = [video_output(engine.instance.card, engine.run(r)).audio for r in requests]
    got, stats = serve_batched(engine, requests)
    assert stats["largest_batch"] == 3 and stats["mean_batch"] > 1.5  # steps really were shared
    for out, alone in zip(got, expected):
        assert out.audio.shape == alone.shape
        assert np.abs(out.audio - alone).max() <= WAVE_RTOL * np.abs(alone).max()
        assert "disabled" not in out.metadata  # it batched: nothing was turned off
