"""Runtime-owned KV cache allocations: handle-based, byte-accounted against one budget.

Loops never keep long-lived cache tensors on shared modules: they ask the runtime
(LoopContext.allocate) and get the buffer back; the runtime records a handle with the
bytes it holds and releases it when the loop ends (finish, failure, cancel). Sessions
that outlive a request (causal-video continuation) will hold handles the same way,
with an idle TTL. Pure bookkeeping, no torch import: unit-tested with fake buffers.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from vidloom.core.errors import CacheBudgetExceeded

T = TypeVar("T")


@dataclass(frozen=True)
class CacheHandle:
    """One allocation: who holds it and how many bytes it is accounted for."""

    id: int
    owner: str  # request id (later: session id)
    nbytes: int


class CacheManager:
    """Every KV allocation of one engine, against `budget_bytes` (None: unlimited). Thread-safe."""

    def __init__(self, budget_bytes: int | None = None) -> None:
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._held: dict[int, tuple[CacheHandle, Any]] = {}
        self._reserved = 0  # bytes of held handles plus builds in flight

    def allocate(self, owner: str, nbytes: int, build: Callable[[], T]) -> tuple[CacheHandle, T]:
        """Reserve `nbytes` for `owner`, then `build()` the buffer; CacheBudgetExceeded if it cannot fit.

        The bytes are reserved before building, so two requests racing for the last
        room cannot both allocate. `build` must produce exactly `nbytes` when its result
        reports `.nbytes` (checked: the accounting must not drift from the memory).
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            if self.budget_bytes is not None and self._reserved + nbytes > self.budget_bytes:
                raise CacheBudgetExceeded(nbytes, self._reserved, self.budget_bytes)
            self._reserved += nbytes
            handle = CacheHandle(next(self._ids), owner, nbytes)
        try:
            buffer = build()
        except BaseException:
            with self._lock:
                self._reserved -= nbytes
            raise
        actual = getattr(buffer, "nbytes", nbytes)
        if actual != nbytes:
            with self._lock:
                self._reserved -= nbytes
            raise AssertionError(f"cache buffer holds {actual} bytes, {nbytes} were reserved")
        with self._lock:
            self._held[handle.id] = (handle, buffer)
        return handle, buffer

    def get(self, handle: CacheHandle) -> Any:
        with self._lock:
            entry = self._held.get(handle.id)
        if entry is None:
            raise KeyError(f"cache handle {handle.id} ({handle.owner}) was released")
        return entry[1]

    def release(self, handle: CacheHandle) -> bool:
        """Return the handle's bytes to the budget; False if it was already released."""
        with self._lock:
            entry = self._held.pop(handle.id, None)
            if entry is None:
                return False
            self._reserved -= handle.nbytes
        return True

    def release_owner(self, owner: str) -> int:
        """Release every handle `owner` holds; returns how many."""
        with self._lock:
            handles = [h for h, _ in self._held.values() if h.owner == owner]
        return sum(self.release(h) for h in handles)

    @property
    def bytes_in_use(self) -> int:
        with self._lock:
            return self._reserved

    def stats(self) -> dict[str, Any]:
        """For metrics: bytes held, the budget, handles and distinct owners."""
        with self._lock:
            owners = {h.owner for h, _ in self._held.values()}
            return {"bytes_in_use": self._reserved, "budget_bytes": self.budget_bytes,
                    "handles": len(self._held), "owners": len(owners)}
