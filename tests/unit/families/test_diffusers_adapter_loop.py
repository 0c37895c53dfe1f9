"""PipelineLoop's handshake with a pipeline thread, driven like the runtime drives it (init / next / advance /
finalize), over a small callable with diffusers' step-hook contract."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from vidloom.core.errors import InvalidRequest
from vidloom.core.loop import Done
from vidloom.core.request import GenerationRequest
from vidloom.families.diffusers_adapter.loop import PipelineFailed, PipelineLoop


class CountingPipeline:
    """Calls `callback_on_step_end` after each of `num_inference_steps` steps, as diffusers pipelines do; records
    which thread ran each step and whether a step ran while the caller's thread was also running."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.scheduler = object()
        self.fail_at = fail_at
        self.ran: list[int] = []
        self.threads: set[str] = set()
        self._num_timesteps = 0

    def __call__(self, *, prompt: str, num_inference_steps: int, callback_on_step_end: Any, **_: Any) -> Any:
        self._num_timesteps = num_inference_steps
        for i in range(num_inference_steps):
            if i == self.fail_at:
                raise ValueError(f"step {i} failed")
            self.ran.append(i)
            self.threads.add(threading.current_thread().name)
            callback_on_step_end(self, i, 1000 - i, {})
        return f"decoded {prompt}"


class Holder:
    def __init__(self) -> None:
        self.releases: list[Any] = []

    def hold(self, release: Any) -> None:
        self.releases.append(release)


def _loop(pipe: CountingPipeline) -> PipelineLoop:
    return PipelineLoop(pipe, "callback_on_step_end",
                        lambda r: {"prompt": r.prompt, "num_inference_steps": r.num_inference_steps})


def _drive(loop: PipelineLoop, state: Any, plans: int) -> list[tuple[int, int | None]]:
    seen = []
    for _ in range(plans):
        plan = loop.next(state)
        assert not isinstance(plan, Done)
        seen.append((plan.index, plan.total))
        state = loop.advance(state, plan.call(**plan.inputs))
    return seen


def test_one_plan_per_step_then_finalize_returns_the_output():
    pipe = CountingPipeline()
    loop, ctx = _loop(pipe), Holder()
    state = loop.init({"request": GenerationRequest(prompt="fox", num_inference_steps=3)}, ctx)
    assert _drive(loop, state, 3) == [(0, 3), (1, 3), (2, 3)]
    assert isinstance(loop.next(state), Done) and pipe.ran == [0, 1, 2]
    assert loop.finalize(state) == {"pipeline_output": "decoded fox"}
    assert pipe.threads == {"vidloom-diffusers-pipeline"}  # never the caller's thread


def test_each_plan_runs_exactly_one_step_and_stop_ends_the_call_where_it_paused():
    pipe = CountingPipeline()
    loop, ctx = _loop(pipe), Holder()
    state = loop.init({"request": GenerationRequest(prompt="fox", num_inference_steps=50)}, ctx)
    _drive(loop, state, 2)
    assert pipe.ran == [0, 1]  # paused in the second step's hook: nothing ran ahead
    for release in ctx.releases:  # the runtime's release path (cancel, failure)
        release()
    assert pipe.ran == [0, 1] and state.pipe._interrupt is True
    assert not [t for t in threading.enumerate() if t.name == "vidloom-diffusers-pipeline"]


def test_a_pipeline_error_is_raised_on_the_runtime_thread_as_ours():
    loop, ctx = _loop(CountingPipeline(fail_at=1)), Holder()
    state = loop.init({"request": GenerationRequest(prompt="fox", num_inference_steps=3)}, ctx)
    _drive(loop, state, 1)
    plan = loop.next(state)
    with pytest.raises(PipelineFailed, match="CountingPipeline failed after 1 completed step: ValueError: step 1"):
        loop.advance(state, plan.call())


def test_a_value_error_before_the_first_step_is_the_pipeline_refusing_the_request():
    loop, ctx = _loop(CountingPipeline(fail_at=0)), Holder()
    state = loop.init({"request": GenerationRequest(prompt="fox", num_inference_steps=3)}, ctx)
    with pytest.raises(InvalidRequest, match="CountingPipeline refused it: step 0 failed"):
        loop.advance(state, loop.next(state).call())


def test_requests_step_their_own_copy_of_the_pipeline():
    pipe = CountingPipeline()
    loop = _loop(pipe)
    a = loop.init({"request": GenerationRequest(prompt="a", num_inference_steps=2)}, Holder())
    b = loop.init({"request": GenerationRequest(prompt="b", num_inference_steps=2)}, Holder())
    assert a.pipe is not pipe and b.pipe is not a.pipe
    _drive(loop, a, 1)
    _drive(loop, b, 2)
    _drive(loop, a, 1)
    assert loop.finalize(a) == {"pipeline_output": "decoded a"} and loop.finalize(b) == {"pipeline_output": "decoded b"}
