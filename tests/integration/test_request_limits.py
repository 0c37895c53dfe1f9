"""The Python API's own limit: a request whose memory estimate exceeds what the device had free is refused up front."""

from __future__ import annotations

import time

import pytest

from vidloom.core.errors import LimitExceeded
from vidloom.generator import VideoGenerator
from vidloom.runtime.engine import Engine


def test_generate_refuses_a_request_that_cannot_fit_before_allocating(demo_engine: Engine):
    assert demo_engine.limits.max_memory_bytes is not None  # measured when the model loaded
    started = time.perf_counter()
    with pytest.raises(LimitExceeded) as info:
        # ~340 GB by the demo's estimate: more than any test machine has free.
        VideoGenerator(demo_engine).generate("a cat", height=16384, width=16384, num_frames=1, num_inference_steps=1)
    assert info.value.field == "width" and "max_request_memory" in str(info.value)
    assert time.perf_counter() - started < 1.0  # refused at validation, not after a run


def test_generate_still_runs_requests_that_fit(demo_engine: Engine):
    out = VideoGenerator(demo_engine).generate("a cat", height=32, width=48, num_frames=1, num_inference_steps=1, seed=0)
    assert out.frames.shape[:3] == (1, 32, 48)
