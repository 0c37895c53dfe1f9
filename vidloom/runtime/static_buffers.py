"""Long-lived buffers that captured step bodies write in place, kept for the next request of the same shape.

A CUDA graph replays its kernels on the addresses it recorded. A causal rollout's step writes the chunk's K/V into
the request's KV slab and reads the valid prefix back, so a graph recorded over one request's slab would write into
that slab at every replay. Under cuda_graphs the slab is therefore a static buffer: when a request ends it goes
back to this pool instead of being freed, and the next request of the same slab shape takes it, so the graphs
recorded over it replay for that request (runtime.cudagraph keys them by the buffer's identity). Two requests
running at once take two buffers, each with its own graphs.

Accounting: a buffer is charged to the cache budget (kv_cache_budget_bytes) all the time, to the request that holds
it while one does and to POOL_OWNER while it is idle, so the budget sees the memory the graphs keep. On the request
memory ledger (runtime.admission) a held buffer is part of its request's estimate and an idle one holds its own
entry, taken once the request that gave it back has left the ledger (`settle`); an idle buffer the ledger has no
room for is dropped then. When an allocation or an admission finds no room, idle buffers are dropped together with
every graph recorded over them (`forget`) and it is tried again; a buffer that a request holds is never dropped.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable, TypeVar

from vidloom.core.errors import CacheBudgetExceeded
from vidloom.runtime.admission import MemoryAdmission
from vidloom.runtime.cache_manager import CacheHandle, CacheManager

T = TypeVar("T")

POOL_OWNER = "cuda-graphs-static"
"""The cache manager's owner of idle static buffers (its stats count them as one owner)."""


class StaticBuffers:
    """Idle static buffers by key (a slab shape, dtype and device: whatever the loop says makes two
    interchangeable); `forget(buffer)` drops what refers to a buffer before it is freed (captured graphs)."""

    def __init__(self, forget: Callable[[Any], None]) -> None:
        self._forget = forget
        self._idle: dict[Hashable, list[tuple[CacheHandle, Any]]] = {}
        self._ledger: MemoryAdmission | None = None  # the request memory ledger idle buffers are entered on
        self._unsettled: list[Any] = []  # buffers given back, not on the ledger yet (see settle)
        self._lock = threading.Lock()
        self.reused = 0  # takes served by an idle buffer
        self.built = 0  # takes that built a new one
        self.dropped = 0  # idle buffers freed to make room

    def take(self, caches: CacheManager, owner: str, key: Hashable, nbytes: int,
             build: Callable[[], T]) -> tuple[CacheHandle, T]:
        """An idle buffer of `key` charged to `owner`, else a new one `build()`s (cache manager accounting,
        CacheBudgetExceeded when even dropping every idle buffer leaves no room)."""
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                handle, buffer = idle.pop()
                self.reused += 1
                self._leave_ledger(buffer)  # the taker's estimate counts it from now on
                return caches.transfer(handle, owner), buffer
        try:
            handle, buffer = caches.allocate(owner, nbytes, build)
        except CacheBudgetExceeded:
            if not self.make_room(caches):
                raise
            handle, buffer = caches.allocate(owner, nbytes, build)
        with self._lock:
            self.built += 1
        return handle, buffer

    def give(self, caches: CacheManager, key: Hashable, handle: CacheHandle, buffer: Any) -> None:
        """`buffer` back from the request that held it (`handle`): idle, charged to POOL_OWNER."""
        try:
            pooled = caches.transfer(handle, POOL_OWNER)
        except KeyError:  # its owner's handles were released already (release_owner): nothing to keep
            self._forget(buffer)
            return
        with self._lock:
            self._idle.setdefault(key, []).append((pooled, buffer))
            self._unsettled.append(buffer)

    def settle(self, caches: CacheManager, ledger: MemoryAdmission | None) -> None:
        """Enter buffers given back since the last call on `ledger` (their requests have left it), each under its
        own entry; one it has no room for is dropped with its graphs."""
        with self._lock:
            unsettled, self._unsettled = self._unsettled, []
            self._ledger = ledger
        for buffer in {id(b): b for b in unsettled}.values():  # given back twice in between: once
            idle = self._idle_entry(buffer)
            if idle is None:
                continue  # taken again before it settled: its taker's estimate counts it
            if ledger is None or ledger.try_reserve(_entry(buffer), idle.nbytes, "idle static buffer"):
                continue
            with self._lock:
                for entries in self._idle.values():
                    entries[:] = [e for e in entries if e[1] is not buffer]
            self._free(caches, [(idle, buffer)])

    def make_room(self, caches: CacheManager) -> bool:
        """Free every idle buffer and the graphs recorded over it (cache budget and ledger alike); False when there
        was none."""
        with self._lock:
            idle = [entry for entries in self._idle.values() for entry in entries]
            self._idle.clear()
            self._unsettled.clear()
        self._free(caches, idle)
        return bool(idle)

    def _free(self, caches: CacheManager, entries: list[tuple[CacheHandle, Any]]) -> None:
        for handle, buffer in entries:
            self._leave_ledger(buffer)
            self._forget(buffer)
            caches.release(handle)
        self.dropped += len(entries)

    def _idle_entry(self, buffer: Any) -> CacheHandle | None:
        """The pool's current handle of `buffer` while it is idle; None once a request took it."""
        with self._lock:
            return next((h for entries in self._idle.values() for h, b in entries if b is buffer), None)

    def _leave_ledger(self, buffer: Any) -> None:
        if self._ledger is not None:
            self._ledger.release(_entry(buffer))

    def stats(self) -> dict[str, int]:
        with self._lock:
            idle = sum(len(entries) for entries in self._idle.values())
        return {"idle": idle, "reused": self.reused, "built": self.built, "dropped": self.dropped}


def _entry(buffer: Any) -> tuple[str, int]:
    """An idle buffer's owner name on the request memory ledger."""
    return (POOL_OWNER, id(buffer))
