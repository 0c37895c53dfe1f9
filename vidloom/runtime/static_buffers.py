"""Long-lived buffers that captured step bodies write in place, kept for the next request of the same shape.

A CUDA graph replays its kernels on the addresses it recorded. A causal rollout's step writes the chunk's K/V into
the request's KV slab and reads the valid prefix back, so a graph recorded over one request's slab would write into
that slab at every replay. Under cuda_graphs the slab is therefore a static buffer: when a request ends it goes
back to this pool instead of being freed, and the next request of the same slab shape takes it, so the graphs
recorded over it replay for that request (runtime.cudagraph keys them by the buffer's identity). Two requests
running at once take two buffers, each with its own graphs.

Accounting: a buffer is charged to the cache budget (kv_cache_budget_bytes) all the time, to the request that holds
it while one does and to POOL_OWNER while it is idle, so the budget sees the memory the graphs keep. When an
allocation finds no room, idle buffers are dropped together with every graph recorded over them (`forget`), then
the allocation is tried again; a buffer that a request holds is never dropped.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable, TypeVar

from vidloom.core.errors import CacheBudgetExceeded
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
                return caches.transfer(handle, owner), buffer
        try:
            handle, buffer = caches.allocate(owner, nbytes, build)
        except CacheBudgetExceeded:
            if not self._drop_idle(caches):
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

    def _drop_idle(self, caches: CacheManager) -> bool:
        """Free every idle buffer and the graphs recorded over it; False when there was none."""
        with self._lock:
            idle = [entry for entries in self._idle.values() for entry in entries]
            self._idle.clear()
        for handle, buffer in idle:
            self._forget(buffer)
            caches.release(handle)
        self.dropped += len(idle)
        return bool(idle)

    def stats(self) -> dict[str, int]:
        with self._lock:
            idle = sum(len(entries) for entries in self._idle.values())
        return {"idle": idle, "reused": self.reused, "built": self.built, "dropped": self.dropped}
