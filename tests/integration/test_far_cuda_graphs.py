"""CUDA graphs of AnyFlow-FAR rollout steps, driven on CPU by the stand-in capturer (tests/helpers/graph_capturer):
the KV slab a step writes in place is a static buffer (runtime.static_buffers) that passes from request to request.

What a real graph would get wrong shows here as a difference from the plain run: a replay that wrote the chunk's
K/V into another request's slab, or read another request's context, or a slab handed over with a stale context.
Every output is compared bit-exactly with the plain engine's (the stand-in replays the same ops on the same values).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.batched_runs import serve_batched
from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from tests.helpers.graph_capturer import UNCAPTURABLE, RecordingCapturer, graphed_generator, step_ops
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest, resolve_request
from vidloom.core.loop import NETWORK
from vidloom.families.wan_causal.loop import STEP
from vidloom.generator import VideoGenerator
from vidloom.runtime.admission import MemoryAdmission

SIZE = dict(height=32, width=48, num_inference_steps=2)
# 9 frames: latent chunks (1, 2), so two chunk positions, two graphs per slab.
A = dict(prompt="a red fox runs over snow", seed=1, guidance_scale=3.0, num_frames=9, **SIZE)
B = dict(prompt="a cat sleeps on a roof", seed=2, guidance_scale=4.5, num_frames=9, **SIZE)
NARROW = {**A, "width": 32}  # a smaller slab


@pytest.fixture(scope="module")
def far_dir(tmp_path_factory) -> Path:
    return write_tiny_far(tmp_path_factory.mktemp("far-graphs") / "far", FAR_A)


@pytest.fixture(scope="module")
def plain(far_dir) -> VideoGenerator:
    return VideoGenerator.from_pretrained(far_dir, device="cpu", deploy=DeployConfig(kv_session_ttl_s=600))


def _video(gen: VideoGenerator, fields: dict[str, Any]) -> np.ndarray:
    return gen.engine.run(GenerationRequest(**fields))["video"]


def _interleaved(gen: VideoGenerator, requests: list[dict[str, Any]]) -> list[np.ndarray]:
    """Runs started together and stepped in turn, one unit each, so both hold a slab at every step."""
    runs = [gen.engine.submit(GenerationRequest(**fields)) for fields in requests]
    done: dict[int, np.ndarray] = {}
    try:
        while len(done) < len(runs):
            for i, run in enumerate(runs):
                if i not in done and run.step():
                    done[i] = run.outputs()["video"]
    finally:
        for run in runs:
            run.close()
    return [done[i] for i in range(len(runs))]


def test_concurrent_rollouts_replay_into_their_own_slabs(plain):
    graphed = graphed_generator(plain, RecordingCapturer())
    got = _interleaved(graphed, [A, B])
    for fields, video in zip((A, B), got):
        assert np.array_equal(video, _video(plain, fields)), fields["prompt"]
    # Two slabs held at once: each with its own two graphs (a graph keyed on one slab never writes the other).
    assert graphed.engine.graph_stats == {"captures": 4, "replays": 8, "fallbacks": 0}
    assert graphed.engine.static_buffer_stats == {"idle": 2, "reused": 0, "built": 2, "dropped": 0}
    # A later request takes an idle slab over: its steps replay that slab's graphs.
    assert np.array_equal(_video(graphed, B), _video(plain, B))
    assert graphed.engine.graph_stats == {"captures": 4, "replays": 12, "fallbacks": 0}
    assert graphed.engine.static_buffer_stats["reused"] == 1


def test_idle_slabs_count_against_the_budget_and_make_room(plain):
    probe = graphed_generator(plain, RecordingCapturer(), kv_session_ttl_s=0.0)  # no session beside the slab
    _video(probe, A)
    slab = probe.engine.caches.bytes_in_use  # the idle slab, still charged
    assert slab > 0 and probe.engine.caches.stats()["owners"] == 1

    capturer = RecordingCapturer()
    graphed = graphed_generator(plain, capturer, kv_cache_budget_bytes=slab, kv_session_ttl_s=0.0)
    assert np.array_equal(_video(graphed, A), _video(plain, A))
    # NARROW's slab fits only once A's idle one is freed, with the graphs recorded over it.
    assert np.array_equal(_video(graphed, NARROW), _video(plain, NARROW))
    assert graphed.engine.static_buffer_stats == {"idle": 1, "reused": 0, "built": 2, "dropped": 1}
    assert graphed.engine.caches.bytes_in_use < slab
    # A again: its graphs went with its slab, so they are captured anew (and replay correctly).
    assert np.array_equal(_video(graphed, A), _video(plain, A))
    assert graphed.engine.graph_stats == {"captures": 6, "replays": 12, "fallbacks": 0}
    assert capturer.calls == 6


def test_an_idle_slab_holds_the_request_ledger_until_a_request_needs_its_room(plain):
    graphed = graphed_generator(plain, RecordingCapturer(), kv_session_ttl_s=0.0)
    engine = graphed.engine
    wide = {**A, "width": 64}
    need = engine.estimator(resolve_request(GenerationRequest(**wide), engine.instance.card))
    engine.admission = MemoryAdmission(need)  # room for one WIDE request, nothing beside it
    _video(graphed, A)
    slab = engine.caches.bytes_in_use
    assert engine.admission.in_use == slab  # A left the ledger; its idle slab holds an entry of its own
    # WIDE does not fit beside it: the idle slab and its graphs go, then WIDE is admitted and runs.
    assert np.array_equal(_video(graphed, wide), _video(plain, wide))
    assert engine.static_buffer_stats == {"idle": 1, "reused": 0, "built": 2, "dropped": 1}
    assert engine.admission.in_use == engine.caches.bytes_in_use  # now WIDE's idle slab


def test_a_session_of_a_graphed_rollout_extends_like_the_plain_one(plain):
    graphed = graphed_generator(plain, RecordingCapturer())
    extension = dict(prompt="a cat walks on the ice", num_frames=21, num_inference_steps=2, seed=2, guidance_scale=3.0)
    videos = []
    for gen in (plain, graphed):
        source = gen.generate(A["prompt"], **{k: v for k, v in A.items() if k != "prompt"})
        assert source.session is not None
        out = gen.engine.run(GenerationRequest(extend_from=source.session, **extension))
        assert out["session"]["resumed"] == "resident"
        videos.append(out["video"])
        gen.engine.caches.release_session(source.session.session_id)
    assert np.array_equal(*videos)
    # The extension's first new chunk replays from the resident session's context, in a slab of its own shape.
    assert graphed.engine.graph_stats["fallbacks"] == 0 and graphed.engine.graph_stats["replays"] > 0
    assert graphed.engine.static_buffer_stats["idle"] == 2  # the source's slab and the extension's


def test_a_rollout_step_runs_no_op_a_cuda_graph_cannot_hold(plain):
    # Chunk 2 of 13 frames (chunks 1, 2, 1): a step after a prefill, its frames' tokens repeated per frame.
    ops = step_ops(plain.engine.submit(GenerationRequest(**{**A, "num_frames": 13})),
                   lambda plan: plan.loop == STEP and plan.inputs[NETWORK].cache_scope == 2)
    assert not ops & UNCAPTURABLE, sorted(ops & UNCAPTURABLE)


def test_under_policy_batch_graphed_rollouts_run_alone_and_say_why(plain):
    graphed = graphed_generator(plain, RecordingCapturer(), kv_session_ttl_s=0.0)
    got, stats = serve_batched(graphed.engine, [GenerationRequest(**A), GenerationRequest(**B)])
    assert stats["largest_batch"] == 1, stats  # a graph is recorded over one request's slab
    for out, fields in zip(got, (A, B)):
        assert out.metadata["disabled"]["batching"].startswith("cuda_graphs: "), out.metadata.get("disabled")
        assert np.array_equal(out.frames, plain.generate(fields["prompt"], **{k: v for k, v in fields.items()
                                                                              if k != "prompt"}).frames)
    assert graphed.engine.graph_stats["fallbacks"] == 0 and graphed.engine.graph_stats["replays"] > 0
