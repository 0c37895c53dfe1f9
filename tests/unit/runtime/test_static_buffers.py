"""Static buffers under cuda_graphs (runtime.static_buffers): handed from request to request of one key, charged to
the cache budget while idle, freed with the graphs recorded over them when an allocation needs the room.

Fake buffers (objects with `nbytes`) for the pool's bookkeeping; one GraphedStep with the stand-in capturer for a
step that writes into a buffer in place, keyed on it by identity."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from tests.helpers.graph_capturer import RecordingCapturer, Slab, SlabView
from vidloom.core.errors import CacheBudgetExceeded
from vidloom.runtime.admission import MemoryAdmission
from vidloom.runtime.cache_manager import CacheManager
from vidloom.runtime.cudagraph import StepGraphs
from vidloom.runtime.static_buffers import POOL_OWNER, StaticBuffers


@dataclass(eq=False)
class _Buffer:
    nbytes: int


@dataclass
class _Forgotten:
    buffers: list[object] = field(default_factory=list)

    def __call__(self, buffer: object) -> None:
        self.buffers.append(buffer)


def _owners(caches: CacheManager) -> list[str]:
    return sorted(handle.owner for handle, _ in caches._held.values())  # noqa: SLF001 - the bookkeeping under test


def test_an_idle_buffer_stays_charged_and_goes_to_the_next_request_of_its_key():
    caches, forgotten = CacheManager(budget_bytes=100), _Forgotten()
    pool = StaticBuffers(forgotten)
    handle, first = pool.take(caches, "req-1", "slab-a", 60, lambda: _Buffer(60))
    pool.give(caches, "slab-a", handle, first)
    assert caches.bytes_in_use == 60 and _owners(caches) == [POOL_OWNER]
    handle, again = pool.take(caches, "req-2", "slab-a", 60, lambda: _Buffer(60))
    assert again is first and caches.bytes_in_use == 60 and _owners(caches) == ["req-2"]
    assert pool.stats() == {"idle": 0, "reused": 1, "built": 1, "dropped": 0}
    assert forgotten.buffers == []


def test_no_room_frees_idle_buffers_and_what_refers_to_them_then_refuses_if_still_short():
    caches, forgotten = CacheManager(budget_bytes=100), _Forgotten()
    pool = StaticBuffers(forgotten)
    handle, idle = pool.take(caches, "req-1", "slab-a", 60, lambda: _Buffer(60))
    pool.give(caches, "slab-a", handle, idle)
    _, other = pool.take(caches, "req-2", "slab-b", 50, lambda: _Buffer(50))
    assert forgotten.buffers == [idle] and caches.bytes_in_use == 50
    assert pool.stats() == {"idle": 0, "reused": 0, "built": 2, "dropped": 1}
    # Held buffers are never freed: nothing idle is left, so a request that does not fit is refused.
    with pytest.raises(CacheBudgetExceeded):
        pool.take(caches, "req-3", "slab-a", 60, lambda: _Buffer(60))
    assert forgotten.buffers == [idle] and caches.bytes_in_use == 50


def test_a_buffer_whose_owner_was_released_already_is_not_kept():
    caches, forgotten = CacheManager(), _Forgotten()
    pool = StaticBuffers(forgotten)
    handle, buffer = pool.take(caches, "req-1", "slab-a", 10, lambda: _Buffer(10))
    caches.release_owner("req-1")
    pool.give(caches, "slab-a", handle, buffer)
    assert forgotten.buffers == [buffer] and pool.stats()["idle"] == 0 and caches.bytes_in_use == 0


def _write_then_read(network: SlabView, x: torch.Tensor) -> torch.Tensor:
    network.slab.rows[:2] = x
    return network.slab.rows.sum().reshape(1)


def test_a_graph_keyed_on_a_slab_writes_into_it_and_goes_with_it():
    graphs = StepGraphs(torch.device("cpu"), RecordingCapturer())
    step = graphs.get(_write_then_read)
    slab, other = Slab(), Slab()
    assert step(network=SlabView(slab), x=torch.ones(2)).item() == 2.0
    assert step(network=SlabView(slab), x=torch.full((2,), 3.0)).item() == 6.0  # replayed, into the same slab
    assert step(network=SlabView(other), x=torch.ones(2)).item() == 2.0  # its own graph, its own slab
    assert (step.captures, step.replays) == (2, 3) and slab.rows[:2].tolist() == [3.0, 3.0]
    assert graphs.forget(slab) == 1
    step(network=SlabView(slab), x=torch.ones(2))
    assert step.captures == 3


def test_an_idle_buffer_takes_its_own_ledger_entry_once_its_request_left_and_gives_it_to_the_taker():
    caches, ledger, forgotten = CacheManager(), MemoryAdmission(100), _Forgotten()
    pool = StaticBuffers(forgotten)
    handle, buffer = pool.take(caches, "req-1", "slab-a", 60, lambda: _Buffer(60))
    ledger.reserve("req-1", 90)  # the request's estimate, its slab included
    pool.give(caches, "slab-a", handle, buffer)
    ledger.release("req-1")
    pool.settle(caches, ledger)
    assert ledger.in_use == 60 and pool.stats()["idle"] == 1
    pool.take(caches, "req-2", "slab-a", 60, lambda: _Buffer(60))
    assert ledger.in_use == 0, "the taker's estimate counts it"


def test_an_idle_buffer_the_ledger_has_no_room_for_is_dropped_and_make_room_clears_the_ledger():
    caches, ledger, forgotten = CacheManager(), MemoryAdmission(100), _Forgotten()
    pool = StaticBuffers(forgotten)
    first = pool.take(caches, "req-1", "slab-a", 60, lambda: _Buffer(60))
    second = pool.take(caches, "req-2", "slab-a", 60, lambda: _Buffer(60))
    for handle, buffer in (first, second):
        pool.give(caches, "slab-a", handle, buffer)
    pool.settle(caches, ledger)  # room for one of the two
    assert ledger.in_use == 60 and pool.stats()["idle"] == 1 and len(forgotten.buffers) == 1
    assert caches.bytes_in_use == 60
    assert pool.make_room(caches) and ledger.in_use == 0 and caches.bytes_in_use == 0
    assert len(forgotten.buffers) == 2 and not pool.make_room(caches)


def test_a_buffer_taken_and_given_back_again_before_it_settled_settles_once_with_its_current_handle():
    caches, ledger, forgotten = CacheManager(), MemoryAdmission(100), _Forgotten()
    pool = StaticBuffers(forgotten)
    handle, buffer = pool.take(caches, "req-1", "slab-a", 60, lambda: _Buffer(60))
    pool.give(caches, "slab-a", handle, buffer)
    handle, _ = pool.take(caches, "req-2", "slab-a", 60, lambda: _Buffer(60))
    pool.give(caches, "slab-a", handle, buffer)
    ledger.reserve("req-3", 50)  # no room for it now: it is freed, its current charge with it
    pool.settle(caches, ledger)
    assert forgotten.buffers == [buffer] and caches.bytes_in_use == 0 and ledger.in_use == 50
