"""AsyncEngine: worker-thread stepping, queue bound, cancel, failure isolation, policies."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Mapping

import numpy as np
import pytest
import torch

from tests.helpers.polling import wait_until
from vidloom.core.errors import Cancelled, InvalidRequest
from vidloom.core.instance import ModelInstance
from vidloom.core.loop import DONE, StepPlan
from vidloom.core.output import CancelledEvent, CompletedEvent, FailedEvent, ProgressEvent, StartedEvent
from vidloom.core.program import Node, Program
from vidloom.core.request import GenerationRequest
from vidloom.families.wan.demo import demo_card
from vidloom.runtime.async_engine import AsyncEngine, EngineBusy, EngineClosed
from vidloom.runtime.engine import Engine


class GatedLoop:
    """Each step waits on a gate (so tests control timing) and can be told to fail."""

    name = "denoise"

    def __init__(self) -> None:
        self.gate = threading.Semaphore(0)
        self.trace: list[str] = []

    def init(self, slots: Mapping[str, Any], ctx: Any) -> dict:
        r = slots["request"]
        return {"i": 0, "n": r.num_inference_steps, "prompt": r.prompt}

    def next(self, state: dict):
        if state["i"] >= state["n"]:
            return DONE
        return StepPlan(self.name, state["i"], state["n"], call=self._step, inputs={"prompt": state["prompt"]})

    def _step(self, prompt: str) -> None:
        assert self.gate.acquire(timeout=10), "test never opened the gate"
        if prompt == "explode":
            raise RuntimeError("boom")
        self.trace.append(prompt)

    def advance(self, state: dict, result: None) -> dict:
        state["i"] += 1
        return state

    def finalize(self, state: dict) -> dict:
        return {"video": np.zeros((1, 16, 16, 3), dtype=np.float32)}


def _engine(loop: GatedLoop, **kw) -> AsyncEngine:
    program = Program(
        nodes=(Node("denoise", reads=("request",), writes=("video",), loop=loop),),
        inputs=frozenset({"request"}),
        outputs=("video",),
    )
    instance = ModelInstance(demo_card(), {}, torch.device("cpu"), torch.float32, "/nonexistent")
    return AsyncEngine(Engine(instance, program), **kw)


def _req(prompt: str, steps: int) -> GenerationRequest:
    return GenerationRequest(prompt, num_inference_steps=steps, seed=0)


def test_completes_and_streams_events_in_order():
    loop = GatedLoop()
    engine = _engine(loop)
    events = []
    handle = engine.submit(_req("a", 3), on_event=events.append)
    for _ in range(3):
        loop.gate.release()
    video = handle.wait(10)
    assert video.frames.shape == (1, 16, 16, 3)
    kinds = [type(e) for e in events]
    assert kinds == [StartedEvent, ProgressEvent, ProgressEvent, ProgressEvent, CompletedEvent]
    assert [e.step for e in events if isinstance(e, ProgressEvent)] == [1, 2, 3]
    engine.close()


def test_result_is_awaitable():
    loop = GatedLoop()
    engine = _engine(loop)

    async def main():
        handle = engine.submit(_req("a", 2))
        loop.gate.release()
        loop.gate.release()
        return await asyncio.wait_for(handle.result(), 10)

    assert asyncio.run(main()).num_frames == 1
    engine.close()


def test_invalid_request_rejected_at_submit():
    engine = _engine(GatedLoop())
    with pytest.raises(InvalidRequest, match="num_inference_steps"):
        engine.submit(_req("a", 0))
    assert engine.queue_depth == 0
    engine.close()


def test_queue_full_is_rejected_at_once_with_retry_after():
    loop = GatedLoop()
    engine = _engine(loop, queue_size=1)
    first = engine.submit(_req("a", 1))
    wait_until(lambda: engine.in_flight == 1, poll=0.005)
    engine.submit(_req("b", 1))  # waits in the queue
    with pytest.raises(EngineBusy) as info:
        engine.submit(_req("c", 1))
    assert info.value.retry_after_s >= 1
    loop.gate.release()
    loop.gate.release()
    first.wait(10)
    engine.close()


def test_cancel_queued_is_immediate_and_running_stops_at_boundary():
    loop = GatedLoop()
    engine = _engine(loop)
    running_events, queued_events = [], []
    running = engine.submit(_req("run", 5), on_event=running_events.append)
    queued = engine.submit(_req("wait", 5), on_event=queued_events.append)
    wait_until(lambda: engine.in_flight == 1, poll=0.005)

    assert engine.cancel(queued.request_id)
    with pytest.raises(Cancelled):
        queued.wait(1)
    assert [type(e) for e in queued_events] == [CancelledEvent]

    loop.gate.release()  # step 1 of "run"
    wait_until(lambda: any(isinstance(e, ProgressEvent) for e in running_events), poll=0.005)
    assert engine.cancel(running.request_id)
    loop.gate.release()  # step 2 runs, then the boundary check stops it
    with pytest.raises(Cancelled):
        running.wait(10)
    assert isinstance(running_events[-1], CancelledEvent)
    assert loop.trace.count("run") <= 2
    assert (engine.in_flight, engine.queue_depth) == (0, 0)
    assert not engine.cancel(running.request_id)  # finished: nothing to cancel
    engine.close()


def test_failing_request_fails_alone():
    loop = GatedLoop()
    engine = _engine(loop)
    events = []
    bad = engine.submit(_req("explode", 2), on_event=events.append)
    good = engine.submit(_req("fine", 1))
    for _ in range(2):
        loop.gate.release()
    with pytest.raises(RuntimeError, match="boom"):
        bad.wait(10)
    assert isinstance(events[-1], FailedEvent) and events[-1].code == "internal_error"
    assert good.wait(10).num_frames == 1
    engine.close()


def test_buggy_event_callback_does_not_fail_the_request():
    loop = GatedLoop()
    engine = _engine(loop)

    def bad_callback(event):
        raise ValueError("subscriber bug")

    handle = engine.submit(_req("a", 1), on_event=bad_callback)
    loop.gate.release()
    assert handle.wait(10).num_frames == 1
    engine.close()


@pytest.mark.parametrize("policy, expected", [
    ("fifo", ["long"] * 4 + ["short"] * 2),
    ("interleave", ["long", "short", "long", "short", "long", "long"]),
])
def test_policies_order_steps(policy, expected):
    loop = GatedLoop()
    engine = _engine(loop, policy=policy, slots=2)
    handles = [engine.submit(_req("long", 4)), engine.submit(_req("short", 2))]
    for _ in range(6):
        loop.gate.release()
    for h in handles:
        h.wait(10)
    assert loop.trace == expected
    engine.close()


def test_close_cancels_everything_and_refuses_new_work():
    loop = GatedLoop()
    engine = _engine(loop)
    running = engine.submit(_req("a", 3))
    queued = engine.submit(_req("b", 3))
    wait_until(lambda: engine.in_flight == 1, poll=0.005)
    loop.gate.release()
    engine.close()
    for h in (running, queued):
        with pytest.raises(Cancelled):
            h.wait(10)
    with pytest.raises(EngineClosed):
        engine.submit(_req("c", 1))


def test_cleanup_of_a_request_cancelled_from_another_thread_runs_on_the_device_worker(monkeypatch):
    # Clean-up frees device memory; done on the caller's thread it could land inside a CUDA-graph capture.
    from vidloom.runtime.engine import RequestRun

    closed_on: list[str] = []
    original = RequestRun.close

    def recording_close(self) -> None:
        closed_on.append(threading.current_thread().name)
        original(self)

    monkeypatch.setattr(RequestRun, "close", recording_close)
    loop = GatedLoop()
    engine = _engine(loop)
    running = engine.submit(_req("a", 1))
    queued = engine.submit(_req("b", 1))
    assert engine.cancel(queued.request_id)  # from this (the "event loop") thread
    with pytest.raises(Cancelled):
        queued.wait(10)
    loop.gate.release()
    running.wait(10)
    engine.release_memory().result(10)  # a chore queued behind both: the clean-ups ran before it
    assert closed_on == ["vidloom-device-worker", "vidloom-device-worker"]
    engine.close()


def test_release_memory_runs_on_the_worker_while_idle():
    loop = GatedLoop()
    engine = _engine(loop)
    engine.release_memory().result(10)  # resolves although no request is resident
    assert engine.compile_misses == 0
    engine.close()
