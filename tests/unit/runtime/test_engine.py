"""Engine drives loops step by step: progress per step, cancellation at boundaries."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

import pytest
import torch

from vidloom.core.errors import Cancelled, InvalidRequest
from vidloom.core.instance import ModelInstance
from vidloom.core.loop import DONE, StepPlan
from vidloom.core.output import ProgressEvent
from vidloom.core.program import Node, Program
from vidloom.core.request import GenerationRequest
from vidloom.families.wan.demo import demo_card
from vidloom.runtime.engine import CancellationToken, Engine


@dataclass
class CountState:
    value: float
    index: int = 0
    total: int = 0


class CountingLoop:
    """Adds 1 per step: a real Loop whose 'kernel' is trivial, to test the driver."""

    name = "count"

    def __init__(self) -> None:
        self.calls = 0

    def init(self, slots: Mapping[str, Any], ctx: Any) -> CountState:
        return CountState(value=slots["start"], total=slots["request"].num_inference_steps)

    def next(self, state: CountState):
        if state.index >= state.total:
            return DONE
        return StepPlan(self.name, state.index, state.total, call=self._add_one, inputs={"x": state.value})

    def _add_one(self, x: float) -> float:
        self.calls += 1
        return x + 1

    def advance(self, state: CountState, result: float) -> CountState:
        state.value, state.index = result, state.index + 1
        return state

    def finalize(self, state: CountState) -> dict[str, Any]:
        return {"video": state.value}


def _engine(loop: CountingLoop) -> Engine:
    program = Program(
        nodes=(
            Node("start", reads=("request",), writes=("start",), run=lambda s, ctx: {"start": 10.0}),
            Node("count", reads=("request", "start"), writes=("video",), loop=loop),
        ),
        inputs=frozenset({"request"}),
        outputs=("video",),
    )
    instance = ModelInstance(demo_card(), {}, torch.device("cpu"), torch.float32, "/nonexistent")
    return Engine(instance, program)


def test_runs_every_step_and_reports_progress():
    loop = CountingLoop()
    events = []
    out = _engine(loop).run(GenerationRequest("p", num_inference_steps=5, seed=1), on_event=events.append)
    assert out["video"] == 15.0 and loop.calls == 5
    assert [(e.phase, e.step, e.total) for e in events] == [("count", i, 5) for i in range(1, 6)]
    assert out["request"].seed == 1


def test_invalid_request_fails_before_any_step():
    loop = CountingLoop()
    with pytest.raises(InvalidRequest):
        _engine(loop).run(GenerationRequest("p", num_inference_steps=0))
    assert loop.calls == 0


def test_cancel_stops_at_next_step_boundary():
    loop = CountingLoop()
    token = CancellationToken()

    def cancel_after_two(event):
        if isinstance(event, ProgressEvent) and event.step == 2:
            token.cancel()

    with pytest.raises(Cancelled):
        _engine(loop).run(GenerationRequest("p", num_inference_steps=10), on_event=cancel_after_two, cancel=token)
    assert loop.calls == 2


def test_cancel_before_start_runs_nothing():
    loop = CountingLoop()
    token = CancellationToken()
    token.cancel()
    with pytest.raises(Cancelled):
        _engine(loop).run(GenerationRequest("p", num_inference_steps=3), cancel=token)
    assert loop.calls == 0


def test_cancel_from_another_thread():
    # Handshake, no sleeps: step 1's progress callback waits until the other thread has cancelled,
    # so the cancel is in place before the boundary after step 1 and exactly one step runs.
    loop = CountingLoop()
    token = CancellationToken()
    first_step_done, cancelled = threading.Event(), threading.Event()

    def wait_for_cancel(event):
        if isinstance(event, ProgressEvent) and event.step == 1:
            first_step_done.set()
            assert cancelled.wait(10), "the cancelling thread never ran"

    def cancel_from_elsewhere():
        assert first_step_done.wait(10)
        token.cancel()
        cancelled.set()

    thread = threading.Thread(target=cancel_from_elsewhere)
    thread.start()
    with pytest.raises(Cancelled):
        _engine(loop).run(GenerationRequest("p", num_inference_steps=100), on_event=wait_for_cancel, cancel=token)
    thread.join()
    assert loop.calls == 1


def test_runs_can_be_stepped_alternately():
    loop = CountingLoop()
    engine = _engine(loop)
    a = engine.submit(GenerationRequest("p", num_inference_steps=3))
    b = engine.submit(GenerationRequest("p", num_inference_steps=5))
    order = []
    while not (a.done and b.done):
        for name, run in (("a", a), ("b", b)):
            if not run.done:
                run.step()
                order.append(name)
    assert a.outputs()["video"] == 13.0 and b.outputs()["video"] == 15.0
    assert order[:4] == ["a", "b", "a", "b"]  # one unit each, in turn


def test_observer_sees_every_plan_before_it_runs():
    loop = CountingLoop()
    seen: list[tuple[int, float, int]] = []
    run = _engine(loop).submit(
        GenerationRequest("p", num_inference_steps=3, seed=1),
        observer=lambda plan: seen.append((plan.index, plan.inputs["x"], loop.calls)),
    )
    while not run.step():
        pass
    assert seen == [(0, 10.0, 0), (1, 11.0, 1), (2, 12.0, 2)]  # each before its own call


class Watcher:
    """A RunObserver that writes down what it sees, in order."""

    def __init__(self, loop: CountingLoop) -> None:
        self.loop = loop
        self.seen: list[tuple[Any, ...]] = []

    def step_started(self, plan: StepPlan) -> None:
        self.seen.append(("start", plan.index, self.loop.calls))

    def step_finished(self, plan: StepPlan, result: Any, state: CountState) -> None:
        self.seen.append(("finish", plan.index, result, state.value, state.index))

    def node_finished(self, node: str, written: Mapping[str, Any]) -> None:
        self.seen.append(("node", node, dict(written)))


def test_watch_sees_each_step_its_advanced_state_and_every_node_slot():
    loop = CountingLoop()
    watch = Watcher(loop)
    run = _engine(loop).submit(GenerationRequest("p", num_inference_steps=2, seed=1), watch=watch)
    while not run.step():
        pass
    assert watch.seen == [
        ("node", "start", {"start": 10.0}),
        ("start", 0, 0), ("finish", 0, 11.0, 11.0, 1),  # started before its call, finished after advance
        ("start", 1, 1), ("finish", 1, 12.0, 12.0, 2),
        ("node", "count", {"video": 12.0}),
    ]


class HoldingLoop(CountingLoop):
    """Holds a resource through the loop context, as a KV-cache rollout does."""

    def __init__(self) -> None:
        super().__init__()
        self.held = 0
        self.released = 0

    def init(self, slots: Mapping[str, Any], ctx: Any) -> CountState:
        self.held += 1
        ctx.hold(self._release)
        ctx.progress("held", 1, 1)
        return super().init(slots, ctx)

    def _release(self) -> None:
        self.released += 1


def test_held_resources_are_released_on_finish_and_cancel():
    loop = HoldingLoop()
    events = []
    _engine(loop).run(GenerationRequest("p", num_inference_steps=2, seed=1), on_event=events.append)
    assert (loop.held, loop.released) == (1, 1)
    assert ("held", 1, 1) in [(e.phase, e.step, e.total) for e in events]

    token = CancellationToken()

    def cancel_after_one(event):
        if isinstance(event, ProgressEvent) and event.phase == "count":
            token.cancel()

    with pytest.raises(Cancelled):
        _engine(loop).run(GenerationRequest("p", num_inference_steps=5), on_event=cancel_after_one, cancel=token)
    assert (loop.held, loop.released) == (2, 2)


def test_held_resources_are_released_when_a_run_is_closed_mid_loop():
    loop = HoldingLoop()
    run = _engine(loop).submit(GenerationRequest("p", num_inference_steps=5, seed=1))
    run.step()  # the "start" node
    run.step()  # loop init + first step
    assert (loop.held, loop.released) == (1, 0)
    run.close()
    assert loop.released == 1
