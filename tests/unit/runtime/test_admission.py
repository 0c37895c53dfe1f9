"""Memory admission: resident requests' estimates together stay within the device budget, for the sync
Engine (refused with CacheBudgetExceeded), the AsyncEngine (kept queued until room frees) and the scheduler."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pytest
import torch

from vidloom.core.errors import CacheBudgetExceeded, LimitExceeded
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import RequestLimits
from vidloom.core.loop import DONE, StepPlan
from vidloom.core.output import StartedEvent
from vidloom.core.program import Node, Program
from vidloom.core.request import GenerationRequest
from vidloom.families.wan.demo import demo_card
from vidloom.runtime.admission import MemoryAdmission
from vidloom.runtime.async_engine import AsyncEngine
from vidloom.runtime.engine import Engine
from vidloom.runtime.scheduler import Scheduler

MiB = 1 << 20


def test_reservations_add_up_against_the_budget_and_release_frees_room():
    admission = MemoryAdmission(100)
    assert admission.try_reserve("a", 60)
    assert not admission.try_reserve("b", 50)  # 60 + 50 > 100
    assert admission.try_reserve("c", 40) and admission.in_use == 100 and admission.resident == 2
    with pytest.raises(CacheBudgetExceeded) as info:
        admission.reserve("b", 50)
    assert info.value.needed == 50 and info.value.in_use == 100 and "request memory budget" in str(info.value)
    admission.release("a")
    assert admission.try_reserve("b", 50) and admission.in_use == 90
    assert admission.try_reserve("b", 50) and admission.in_use == 90  # holding already: not counted twice


def test_an_idle_budget_admits_anything_and_none_checks_nothing():
    assert MemoryAdmission(10).try_reserve("huge", 1000)  # alone: the submit-time check is the one that refuses
    unlimited = MemoryAdmission(None)
    assert unlimited.try_reserve("a", 1 << 50) and unlimited.try_reserve("b", 1 << 50)
    with pytest.raises(ValueError, match="budget_bytes"):
        MemoryAdmission(0)


@dataclass
class Item:
    key: str
    nbytes: int


def test_scheduler_admits_in_order_while_items_fit():
    admission = MemoryAdmission(100)
    scheduler: Scheduler[Item] = Scheduler("interleave", slots=4, queue_size=8)
    for key, nbytes in (("a", 50), ("b", 60), ("c", 10)):
        scheduler.enqueue(Item(key, nbytes))
    fits = lambda item: admission.try_reserve(item.key, item.nbytes)  # noqa: E731
    assert [i.key for i in scheduler.admit(fits)] == ["a"]  # b does not fit; c may not overtake it
    assert scheduler.waiting == 2
    scheduler.remove("a")
    admission.release("a")
    assert [i.key for i in scheduler.admit(fits)] == ["b", "c"]


class GatedLoop:
    """One step per request that waits on a gate, so the test decides when a request finishes."""

    name = "denoise"

    def __init__(self) -> None:
        self.gate = threading.Semaphore(0)

    def init(self, slots: Mapping[str, Any], ctx: Any) -> dict:
        return {"i": 0, "n": slots["request"].num_inference_steps}

    def next(self, state: dict) -> StepPlan | Any:
        return DONE if state["i"] >= state["n"] else StepPlan(self.name, state["i"], state["n"], call=self._step,
                                                              inputs={})

    def _step(self) -> None:
        assert self.gate.acquire(timeout=10), "test never opened the gate"

    def advance(self, state: dict, result: None) -> dict:
        state["i"] += 1
        return state

    def finalize(self, state: dict) -> dict:
        return {"video": np.zeros((1, 16, 16, 3), dtype=np.float32)}


def _engine(loop: GatedLoop, budget: int) -> Engine:
    """An engine whose card estimates width * MiB per request, against `budget` bytes."""
    program = Program(nodes=(Node("denoise", reads=("request",), writes=("video",), loop=loop),),
                      inputs=frozenset({"request"}), outputs=("video",))
    engine = Engine(ModelInstance(demo_card(), {}, torch.device("cpu"), torch.float32, "/nonexistent"), program)
    engine.estimator = lambda request: request.width * MiB
    engine.limits = RequestLimits(max_memory_bytes=budget)
    engine.admission = MemoryAdmission(budget)
    return engine


def _req(request_id: str, width: int) -> GenerationRequest:
    return GenerationRequest("a cat", width=width, height=16, num_frames=1, num_inference_steps=1, seed=0,
                             request_id=request_id)


def test_sync_engine_refuses_a_run_while_others_hold_the_memory():
    loop = GatedLoop()
    engine = _engine(loop, budget=100 * MiB)
    with pytest.raises(LimitExceeded) as info:  # over the whole budget: never fits, refused at start
        engine.submit(_req("big", 112))
    assert info.value.field == "width" and "max_request_memory" in str(info.value)
    first, second = engine.submit(_req("a", 64)), engine.submit(_req("b", 48))
    assert first.prepare() and engine.admission.in_use == 64 * MiB
    with pytest.raises(CacheBudgetExceeded, match="request memory budget"):
        second.prepare()  # 64 + 48 MiB > 100 MiB, before any of its work
    loop.gate.release()
    while not first.step():
        pass
    first.close()
    assert engine.admission.in_use == 0
    loop.gate.release()
    second.step()
    assert engine.admission.in_use == 48 * MiB
    while not second.step():
        pass
    second.close()
    assert engine.admission.in_use == 0


def test_async_engine_keeps_a_request_queued_until_memory_frees():
    loop = GatedLoop()
    engine = _engine(loop, budget=100 * MiB)
    started: list[str] = []
    async_engine = AsyncEngine(engine, policy="interleave", slots=2, queue_size=4)
    on_event = lambda e: started.append(e.request_id) if isinstance(e, StartedEvent) else None  # noqa: E731
    try:
        first = async_engine.submit(_req("a", 64), on_event)
        second = async_engine.submit(_req("b", 48), on_event)  # a free slot, but not the memory
        _wait(lambda: started == ["a"])
        assert async_engine.in_flight == 1 and async_engine.queue_depth == 1
        loop.gate.release()
        first.wait(10)
        _wait(lambda: started == ["a", "b"])
        loop.gate.release()
        second.wait(10)
        assert engine.admission.in_use == 0
    finally:
        async_engine.close()


def _wait(condition: Any, timeout: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("condition not reached")
