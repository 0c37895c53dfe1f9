"""Cross-request batching of Cosmos3 generation steps (cosmos3-demo, float32): requests whose prompts have equal token
counts (and equal sizes) stack their prefilled prompt K/V and run one forward per step; other prompt lengths run alone.

Batched and single forwards differ only by matmul blocking over the batch (each row attends its own request's prefix
exactly: no padding), so the bound is 1e-5 of the magnitude on the step velocities and 1e-5 absolute on the decoded
float32 video (measured: ~2e-6 on the velocities).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.batched_runs import first_plans
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime.async_engine import AsyncEngine
from vidloom.media.request_inputs import resolve_request
from vidloom.core.footprint import tensor_bytes
from vidloom.runtime.batching import batch_key, run_batched, stacked_bytes

RTOL = 1e-5
VIDEO_TOL = 1e-5
SIZE = dict(height=32, width=32, num_frames=9, fps=16, num_inference_steps=2, guidance_scale=4.0)
# The demo's chat template wraps each prompt: these three give 146 prompt tokens each, "a fox" 144.
EQUAL = ("a boat", "a dog", "a cat")
SHORTER = "a fox"


@pytest.fixture(scope="module")
def engine(demo_cache):
    return VideoGenerator.from_pretrained("cosmos3-demo", device="cpu", dtype="float32", cache_dir=demo_cache).engine


def _request(prompt: str, seed: int, **changes: Any) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, negative_prompt="blurry", seed=seed, **{**SIZE, **changes})


def _denoise_plans(engine, requests):
    """Each request's first denoise plan (its prefixes prefilled); the runs, to close."""
    runs, plans = [engine.submit(r) for r in requests], []
    for run in runs:
        while True:
            while not run.prepare():
                pass
            if run.pending_plan.loop == "denoise":
                break
            run.step()  # a prefix prefill
        plans.append(run.pending_plan)
    return runs, plans


def test_equal_prompt_lengths_share_a_key_and_stack(engine):
    requests = [_request(p, seed) for seed, p in enumerate(EQUAL)]
    requests += [_request(SHORTER, 7), _request(EQUAL[0], 8, width=48)]
    runs, plans = _denoise_plans(engine, requests)
    try:
        lengths = [tuple(len(b.ids) for b in p.inputs["network"].branches) for p in plans]
        assert lengths[0] == lengths[1] == lengths[2] != lengths[3], lengths
        keys = [batch_key(p) for p in plans]
        assert None not in keys
        assert keys[0] == keys[1] == keys[2]
        assert keys[3] != keys[0]  # another prompt length: other prefix K/V shapes and token positions
        assert keys[4] != keys[0]  # another size
        with torch.inference_mode():
            together = run_batched(plans[:3])
            for plan, result in zip(plans[:3], together):
                alone = plan.call(**plan.inputs)
                assert result[0].shape == alone[0].shape == (1, *plan.inputs["latents"].shape[1:])
                assert (result[0] - alone[0]).abs().max() <= RTOL * alone[0].abs().max()
            assert (together[0][0] - together[1][0]).abs().max() > 1e-2  # each row its own prompt and latents
    finally:
        for run in runs:
            run.close()


def test_prefills_of_equal_length_prompts_stack(engine):
    """The prompt prefills stack too (ids [B, L] through the backbone): each request's K/V as its prefill alone."""
    requests = [_request(p, seed) for seed, p in enumerate(EQUAL[:2])] + [_request(SHORTER, 7)]
    with first_plans(engine, requests) as plans:
        assert all(p.loop == "prefix_prefill" for p in plans)
        keys = [batch_key(p) for p in plans]
        assert keys[0] == keys[1] is not None and keys[2] != keys[0]
        with torch.inference_mode():
            together = run_batched(plans[:2])
            for plan, result in zip(plans[:2], together):
                alone = plan.call(**plan.inputs).clone()
                assert result.shape == alone.shape
                assert (result - alone).abs().max() <= RTOL * alone.abs().max()


def test_prefixes_recomputed_every_step_run_alone(engine):
    from vidloom.families.cosmos3.gen_step import Cosmos3View

    runs, plans = _denoise_plans(engine, [_request(EQUAL[0], 1)])
    try:
        view = plans[0].inputs["network"]
        assert Cosmos3View(view.generator, view.backbone, view.branches, None).batch_key() is None
    finally:
        runs[0].close()


def test_served_together_equal_their_single_runs(engine):
    """Three equal-length prompts (different seeds, guidance and step counts) share forwards; a prompt of another
    length runs alone; every video equals its request run alone."""
    requests = [_request(EQUAL[0], 1), _request(EQUAL[1], 2, guidance_scale=6.0),
                _request(EQUAL[2], 3, num_inference_steps=3), _request(SHORTER, 4)]
    expected = [engine.run(r)["video"] for r in requests]
    async_engine = AsyncEngine(engine, policy="batch", slots=len(requests), queue_size=8, batch_wait_s=0.5)
    try:
        handles = [async_engine.submit(r, result=lambda slots: slots) for r in requests]
        got = [h.wait(300)["video"] for h in handles]
        stats = async_engine.batch_stats
    finally:
        async_engine.close()
    assert stats["largest_batch"] == 3, stats  # the equal-length three stacked; "a fox" never joined them
    assert stats["forwards"] < stats["request_steps"], stats
    diffs = []
    for want, have in zip(expected, got):
        want, have = np.asarray(want, dtype=np.float32), np.asarray(have, dtype=np.float32)
        assert want.shape == have.shape
        diffs.append(float(np.abs(want - have).max()))
    print(f"batch stats {stats}; max |video diff| per request {diffs}")
    assert max(diffs) <= VIDEO_TOL
    assert np.abs(np.asarray(expected[0]) - np.asarray(expected[1])).max() > 1e-2


def test_action_requests_of_one_embodiment_batch(cosmos3_action_dir):
    """cosmos3-actions: policy requests of one embodiment (different seeds) stack their vision and action streams
    (the action stream's domain is part of the key); their videos and predicted actions equal each run alone."""
    from vidloom import ActionInput
    from vidloom.generator import build_request
    from tests.helpers.wan_i2v_checkpoints import make_image

    gen = VideoGenerator.from_pretrained(cosmos3_action_dir, device="cpu", dtype="float32")
    action = ActionInput(mode="policy", domain_name="pusht", chunk_size=4, resolution_tier=256)
    requests = [build_request(gen.card, "the arm pushes the red block", image=make_image(64, 48, 1), seed=seed,
                              negative_prompt="blurry", num_inference_steps=2, guidance_scale=3.0, action=action)
                for seed in (1, 2)]
    expected = [gen.engine.run(r) for r in requests]
    async_engine = AsyncEngine(gen.engine, policy="batch", slots=2, queue_size=4, batch_wait_s=0.5)
    try:
        got = [h.wait(300) for h in [async_engine.submit(r, result=lambda slots: slots) for r in requests]]
        stats = async_engine.batch_stats
    finally:
        async_engine.close()
    assert stats["largest_batch"] == 2, stats
    for want, have in zip(expected, got):
        assert np.abs(np.asarray(want["video"]) - np.asarray(have["video"])).max() <= VIDEO_TOL
        assert want["actions"] is not None and want["actions"].shape == have["actions"].shape
        assert np.abs(want["actions"] - have["actions"]).max() <= RTOL * max(np.abs(want["actions"]).max(), 1e-6)
    assert np.abs(expected[0]["actions"] - expected[1]["actions"]).max() > 1e-3


def test_the_stacked_prefixes_are_reserved_and_a_batch_they_do_not_fit_runs_alone(engine):
    """A batched step's stacked copy of its requests' prefixes is in no request's estimate: stacked_bytes measures it
    (the stacked view holds exactly that), and with the ledger full of the requests' own estimates the batch is cut
    to one request per forward (memory_splits), with the same videos."""
    requests = [_request(EQUAL[0], 1), _request(EQUAL[1], 2)]
    runs, plans = _denoise_plans(engine, requests)
    try:
        views = [p.inputs["network"] for p in plans]
        stacked = type(views[0]).stack(views)
        assert sum(v.stacked_bytes for v in views) == tensor_bytes(list(stacked.prefixes)) > 0
        per_sample = sum(tensor_bytes(p.inputs[name]) for p in plans for name in ("latents", "timestep", "sound"))
        assert stacked_bytes(plans) == tensor_bytes(list(stacked.prefixes)) + per_sample
        assert stacked_bytes(plans[:1]) == 0
    finally:
        for run in runs:
            run.close()
    expected = [engine.run(r)["video"] for r in requests]
    estimates = sum(engine.estimator(resolve_request(r, engine.card)) for r in requests)
    budget, engine.admission.budget_bytes = engine.admission.budget_bytes, estimates  # room for both, not the copy
    async_engine = AsyncEngine(engine, policy="batch", slots=2, queue_size=4, batch_wait_s=0.5)
    try:
        got = [h.wait(300)["video"] for h in [async_engine.submit(r, result=lambda slots: slots) for r in requests]]
        stats = async_engine.batch_stats
    finally:
        async_engine.close()
        engine.admission.budget_bytes = budget
    assert stats["largest_batch"] == 1 and stats["memory_splits"] > 0, stats
    assert engine.admission.in_use == 0
    for want, have in zip(expected, got):
        assert np.abs(np.asarray(want, dtype=np.float32) - np.asarray(have, dtype=np.float32)).max() <= VIDEO_TOL
