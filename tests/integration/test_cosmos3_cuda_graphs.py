"""CUDA graphs of Cosmos3 generation steps over prompt-length buckets (cosmos3-demo, float32), driven on CPU by the
stand-in capturer (tests/helpers/graph_capturer.py); the kernels themselves are captured in
tests/gpu/test_cuda_graph_families.py.

Under cuda_graphs each CFG branch's prefix K/V is padded to its bucket (runtime.prompt_buckets.PROMPT_BUCKET) and
the padding keys are masked out, so the graphed step computes the eager step's attention over the same prompt keys
in another summation order: the bound is 1e-5 of the magnitude on the step velocities and 1e-5 absolute on the
decoded float32 video (measured: under 1e-6 on both, max abs 8.1e-7 on the video).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.cosmos3_sound_checkpoints import write_tiny_cosmos3_sound
from tests.helpers.graph_capturer import UNCAPTURABLE, RecordingCapturer, graphed_generator, step_ops
from vidloom.core.request import GenerationRequest, resolve_request
from vidloom.families.cosmos3.memory import footprint, kv_bytes
from vidloom.generator import VideoGenerator
from vidloom.runtime.admission import MemoryAdmission
from vidloom.runtime.batching import batch_key
from vidloom.runtime.prompt_buckets import PROMPT_BUCKET, bucket_length

RTOL = 1e-5
VIDEO_TOL = 1e-5
SIZE = dict(height=32, width=32, num_frames=9, fps=16, num_inference_steps=2, guidance_scale=4.0)
# With the demo's chat template: 146 and 144 prompt tokens, negatives of two lengths, all in the 192-token bucket.
A = dict(prompt="a boat", negative_prompt="blurry", seed=1)
B = dict(prompt="a fox", negative_prompt="blurry, dark", seed=2)
LONG = dict(prompt="a red fox jumps over the lazy dog in the snow " * 6, negative_prompt="blurry", seed=3)


@pytest.fixture(scope="module")
def plain(demo_cache) -> VideoGenerator:
    return VideoGenerator.from_pretrained("cosmos3-demo", device="cpu", dtype="float32", cache_dir=demo_cache)


def _request(fields: dict[str, Any]) -> GenerationRequest:
    return GenerationRequest(**fields, **SIZE)


def _first_step(gen: VideoGenerator, fields: dict[str, Any]):
    """The request's first denoise plan (its prefixes prefilled) and its velocities; the run is closed."""
    run = gen.engine.submit(_request(fields))
    try:
        while True:
            while not run.prepare():
                pass
            if run.pending_plan.loop == "denoise":
                break
            run.step()
        plan = run.pending_plan
        with torch.inference_mode():
            return plan, plan.call(**plan.inputs)
    finally:
        run.close()


def test_graphed_requests_share_a_bucket_and_match_eager(plain):
    capturer = RecordingCapturer()
    graphed = graphed_generator(plain, capturer)
    lengths = {}
    for name, fields in (("A", A), ("B", B), ("LONG", LONG)):
        plan, eager = _first_step(plain, fields)
        padded_plan, padded = _first_step(graphed, fields)
        real = tuple(len(b.ids) for b in plan.inputs["network"].branches)
        lengths[name] = real
        view = padded_plan.inputs["network"]
        assert view.slabs is not None and plan.inputs["network"].slabs is None  # eager keeps unpadded prefixes
        assert tuple(p.shape[-3] for p in view.prefixes) == tuple(bucket_length(n) for n in real)
        assert [int(m.sum()) for m in view.prefix_masks] == list(real)
        assert batch_key(padded_plan) is None  # a graphed step reads its own static prefix buffers: it runs alone
        for want, got in zip(eager, padded):
            if want is not None:
                assert (got - want).abs().max() <= RTOL * want.abs().max(), name
    assert lengths["A"] != lengths["B"] and lengths["A"][0] != lengths["LONG"][0], lengths
    assert {bucket_length(n) for n in (*lengths["A"], *lengths["B"])} == {bucket_length(lengths["A"][0])}
    assert bucket_length(lengths["LONG"][0]) > bucket_length(lengths["A"][0])  # LONG's prompt: the next bucket

    # Whole requests: A captures; B (other prompt and negative lengths, same buckets) replays A's graph from the
    # buffers A gave back; LONG's prompt bucket is another signature (and buffer): it captures anew.
    graphed = graphed_generator(plain, capturer := RecordingCapturer())
    counts = [(1, 2), (1, 4), (2, 6)]
    for fields, (captures, replays) in zip((A, B, LONG), counts):
        want = plain.engine.run(_request(fields))["video"]
        got = graphed.engine.run(_request(fields))["video"]
        assert got.shape == want.shape and np.abs(got - want).max() <= VIDEO_TOL, fields["prompt"]
        assert graphed.engine.graph_stats == {"captures": captures, "replays": replays, "fallbacks": 0}
    assert capturer.calls == 2
    # Two branch buffers built for A and taken over by B; LONG built its prompt's and took A's negative one.
    assert graphed.engine.static_buffer_stats == {"idle": 3, "reused": 3, "built": 3, "dropped": 0}


def test_the_padded_buffers_are_what_the_budget_the_estimate_and_the_ledger_count(plain):
    graphed = graphed_generator(plain, RecordingCapturer())
    before = graphed.engine.caches.bytes_in_use  # the chat pathway's paged KV pool, sized at load
    plan, _ = _first_step(graphed, A)
    instance = graphed.engine.instance
    padded = sum(kv_bytes(instance, p.shape[-3]) for p in plan.inputs["network"].prefixes)
    assert all(p.shape[-3] % PROMPT_BUCKET == 0 for p in plan.inputs["network"].prefixes)
    # The run is closed: its idle buffers stay charged to the cache budget, whole (padding included).
    assert graphed.engine.caches.bytes_in_use - before == padded
    request = resolve_request(_request(A), instance.card)
    assert footprint(instance, request).caches - footprint(plain.engine.instance, request).caches > 0
    assert footprint(instance, request).caches % kv_bytes(instance, PROMPT_BUCKET) == 0

    # On the request memory ledger: once the request has left it, its idle buffers hold an entry of their own.
    engine = graphed.engine
    engine.admission = MemoryAdmission(engine.estimator(request) + padded)
    engine.run(_request(B))  # B takes A's idle buffers over (its estimate counts them), then gives them back
    assert engine.static_buffer_stats == {"idle": 2, "reused": 2, "built": 2, "dropped": 0}
    assert engine.admission.in_use == padded


def test_a_graphed_step_runs_no_op_a_cuda_graph_cannot_hold(plain):
    graphed = graphed_generator(plain, RecordingCapturer())
    ops = step_ops(graphed.engine.submit(_request(B)), lambda plan: plan.loop == "denoise")
    assert not ops & UNCAPTURABLE, sorted(ops & UNCAPTURABLE)


def test_the_sound_pathway_replays_over_the_same_buckets(tmp_path):
    """Sound tokens join the generated stream (their positions follow the prompt like the vision tokens'): the
    same mechanism covers them. Frames and waveform within 1e-5 of the plain run; the second request replays."""
    plain = VideoGenerator.from_pretrained(write_tiny_cosmos3_sound(tmp_path / "sound"), device="cpu")
    graphed = graphed_generator(plain, RecordingCapturer())
    shape = dict(num_frames=9, height=32, width=32, fps=24, num_inference_steps=2, guidance_scale=3.0, sound=True)
    first = GenerationRequest(prompt="a dog barks at the sea", negative_prompt="silence", seed=6, **shape)
    second = GenerationRequest(prompt="a cat purrs", negative_prompt="silence, hum", seed=7, **shape)
    for request, counts in ((first, (1, 2)), (second, (1, 4))):
        want, got = plain.engine.run(request), graphed.engine.run(request)
        assert np.abs(got["video"] - want["video"]).max() <= VIDEO_TOL
        assert got["audio"].shape == want["audio"].shape
        assert (got["audio"] - want["audio"]).abs().max().item() <= VIDEO_TOL
        assert graphed.engine.graph_stats == {"captures": counts[0], "replays": counts[1], "fallbacks": 0}
