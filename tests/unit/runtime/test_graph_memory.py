"""What captured graphs keep is on the request memory ledger (runtime.graph_memory): static inputs exactly, the pool's
growth per capture (the stand-in capturer reports none, so its output buffers), released when graphs are forgotten;
a capture that would not fit runs its step eagerly, says why, and is captured once the room is there."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.helpers.graph_capturer import RecordingCapturer, Slab, SlabView
from vidloom.core.errors import CacheBudgetExceeded
from vidloom.runtime.admission import MemoryAdmission
from vidloom.runtime.cudagraph import StepGraphs
from vidloom.runtime.graph_memory import GRAPHS_KIND, GraphMemory

CPU = torch.device("cpu")


def _step(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * 2 + scale


def _slab_step(network: SlabView, x: torch.Tensor) -> torch.Tensor:
    return x + 1


def _graphs(budget: int | None) -> tuple[StepGraphs, MemoryAdmission]:
    graphs, ledger = StepGraphs(CPU, RecordingCapturer()), MemoryAdmission(budget)
    graphs.memory.attach(ledger)
    return graphs, ledger


def test_a_capture_charges_its_static_inputs_and_outputs_and_forgetting_frees_them():
    graphs, ledger = _graphs(10_000)
    step = graphs.get(_slab_step)
    slab_a, slab_b = Slab(), Slab()
    step(network=SlabView(slab_a), x=torch.ones(3, 4))  # x: 48 bytes of static input, 48 of output
    assert ledger.held_by(GRAPHS_KIND) == 48 + 48 == ledger.in_use
    step(network=SlabView(slab_a), x=torch.ones(3, 4))  # replayed: nothing new
    step(network=SlabView(slab_b), x=torch.ones(3, 4))  # a second graph shares x's static buffer, adds its output
    assert step.captures == 2 and ledger.held_by(GRAPHS_KIND) == 48 + 2 * 48
    assert graphs.forget(slab_a) == 1
    assert ledger.held_by(GRAPHS_KIND) == 48 + 2 * 48, "the pool keeps what it grew while a graph still uses it"
    assert graphs.forget(slab_b) == 1
    assert ledger.in_use == 0 and graphs.memory.pool_bytes == 0


def test_a_capture_over_the_budget_runs_eagerly_says_why_and_is_captured_once_room_frees(caplog):
    graphs, ledger = _graphs(200)
    ledger.reserve("request", 140)  # a resident request's estimate: 60 bytes left
    step = graphs.get(_step)
    x = torch.arange(12.0).reshape(3, 4)
    with caplog.at_level(logging.WARNING, logger="vidloom.runtime.cudagraph"):
        out = step(x=x, scale=0.5)  # 48 + 4 bytes of static inputs fit, with 48 of output (its pool) not: 100 > 60
    assert torch.equal(out, _step(x, 0.5)) and step.captures == 0 and step.fallbacks == 1
    assert step.last_eager is not None and "runs eagerly" in step.last_eager
    assert "request memory budget" in caplog.text and "x=(3, 4)" in caplog.text
    assert ledger.in_use == 140, "a refused capture leaves nothing on the ledger"
    assert graphs.capturer.calls == 1
    step(x=x, scale=0.5)  # still no room: not even captured again
    assert graphs.capturer.calls == 1 and step.fallbacks == 1 and step.last_eager is not None
    ledger.release("request")
    assert torch.equal(step(x=x, scale=1.5), _step(x, 1.5))
    assert step.captures == 1 and step.last_eager is None and ledger.held_by(GRAPHS_KIND) == 100


def test_static_inputs_that_do_not_fit_are_refused_before_capturing():
    graphs, ledger = _graphs(200)
    ledger.reserve("request", 180)
    step = graphs.get(_step)
    step(x=torch.ones(3, 4), scale=0.5)  # 52 bytes of static inputs > 20 free
    assert graphs.capturer.calls == 0 and step.fallbacks == 1 and "static inputs" in step.last_eager
    assert ledger.in_use == 180


def test_growth_of_a_pool_other_graphs_keep_stays_charged_until_it_retires():
    retired: list[bool] = []
    memory = GraphMemory(lambda: retired.append(True))
    ledger = MemoryAdmission(100)
    memory.attach(ledger)
    assert memory.keep(60)
    assert not memory.keep(60), "120 > 100: the new graph is discarded"
    assert ledger.in_use == 120, "but the pool it grew is still held by the first graph"
    memory.dropped(1)
    assert ledger.in_use == 0 and retired == [True]
    assert not memory.keep(160) and ledger.in_use == 0 and retired == [True, True]  # alone: the pool goes with it


def test_a_request_refused_for_room_is_told_what_the_graphs_hold():
    graphs, ledger = _graphs(200)
    graphs.get(_step)(x=torch.ones(3, 4), scale=0.5)  # 52 bytes of static inputs, 48 of output
    ledger.reserve("a", 50)
    with pytest.raises(CacheBudgetExceeded, match=r"held by cuda graphs \(100 B\), 1 running request\(s\)"):
        ledger.reserve("b", 60)
