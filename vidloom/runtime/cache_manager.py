"""Runtime-owned KV cache allocations: handle-based, byte-accounted against one budget.

Loops never keep long-lived cache tensors on shared modules: they ask the runtime
(LoopContext.allocate) and get the buffer back; the runtime records a handle with the
bytes it holds and releases it when the loop ends (finish, failure, cancel). Pure
bookkeeping, no torch import: unit-tested with fake buffers.

Sessions: a handle owned by a session id instead of a request (a finished causal video's
KV, kept so an extension can start from it). A session lives until its idle TTL passes
(`session_ttl_s`, checked on every call, no timer thread here: a server calls `expire`
on its own schedule), it is released (video deleted),
or an allocation needs its room: then the least recently used sessions not in use are
evicted before CacheBudgetExceeded is considered. Losing a session costs recompute,
never correctness: its owner rebuilds the KV from stored latents.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
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


@dataclass
class _Session:
    handle: CacheHandle
    last_used: float
    pins: int = 0  # requests reading it right now: never evicted while > 0


class CacheManager:
    """Every KV allocation of one engine, against `budget_bytes` (None: unlimited). Thread-safe.

    `session_ttl_s`: how long an idle session stays resident (0: sessions are not kept).
    """

    def __init__(self, budget_bytes: int | None = None, session_ttl_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_bytes = budget_bytes
        self.session_ttl_s = session_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._held: dict[int, tuple[CacheHandle, Any]] = {}
        self._reserved = 0  # bytes of held handles plus builds in flight
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently used first
        self.evictions = 0  # sessions dropped to make room
        self.expirations = 0  # sessions dropped after their idle TTL

    def allocate(self, owner: str, nbytes: int, build: Callable[[], T]) -> tuple[CacheHandle, T]:
        """Reserve `nbytes` for `owner`, then `build()` the buffer; CacheBudgetExceeded if it cannot fit.

        The bytes are reserved before building, so two requests racing for the last
        room cannot both allocate. `build` must produce exactly `nbytes` when its result
        reports `.nbytes` (checked: the accounting must not drift from the memory).
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            self._expire_locked()
            if self.budget_bytes is not None and self._reserved + nbytes > self.budget_bytes:
                self._evict_locked(self._reserved + nbytes - self.budget_bytes)
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
            return self._release_locked(handle)

    def _release_locked(self, handle: CacheHandle) -> bool:
        entry = self._held.pop(handle.id, None)
        if entry is None:
            return False
        self._reserved -= handle.nbytes
        session = self._sessions.get(handle.owner)
        if session is not None and session.handle.id == handle.id:
            del self._sessions[handle.owner]
        return True

    def transfer(self, handle: CacheHandle, owner: str) -> CacheHandle:
        """The same buffer and bytes held by `owner` instead (one step: no other allocation can take the room
        in between); KeyError when the handle was released."""
        with self._lock:
            entry = self._held.pop(handle.id, None)
            if entry is None:
                raise KeyError(f"cache handle {handle.id} ({handle.owner}) was released")
            moved = CacheHandle(next(self._ids), owner, handle.nbytes)
            self._held[moved.id] = (moved, entry[1])
            return moved

    def release_owner(self, owner: str) -> int:
        """Release every handle `owner` holds; returns how many."""
        with self._lock:
            handles = [h for h, _ in self._held.values() if h.owner == owner]
        return sum(self.release(h) for h in handles)

    # -- sessions ---------------------------------------------------------------------

    def put_session(self, session_id: str, nbytes: int, build: Callable[[], T]) -> CacheHandle:
        """Keep `build()` (`nbytes`) as `session_id`'s resident KV, replacing any it had.

        May evict idle sessions to make room; CacheBudgetExceeded if it still does not fit.
        """
        self.release_session(session_id)
        handle, _ = self.allocate(session_id, nbytes, build)
        with self._lock:
            if handle.id in self._held:  # not released by a racing release_owner
                self._sessions[session_id] = _Session(handle, self._clock())
        return handle

    def checkout_session(self, session_id: str) -> Any | None:
        """The session's buffer, pinned (not evictable) until `checkin_session`; None when not resident."""
        with self._lock:
            self._expire_locked()
            session = self._sessions.get(session_id)
            if session is None:
                return None
            session.pins += 1
            session.last_used = self._clock()
            self._sessions.move_to_end(session_id)
            return self._held[session.handle.id][1]

    def checkin_session(self, session_id: str) -> None:
        """Unpin after `checkout_session`; its idle TTL runs from now."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.pins > 0:
                session.pins -= 1
                session.last_used = self._clock()

    def release_session(self, session_id: str) -> bool:
        """Drop the session's KV now (its video was deleted); False if none was resident."""
        with self._lock:
            session = self._sessions.get(session_id)
            return session is not None and self._release_locked(session.handle)

    def expire(self) -> int:
        """Drop sessions idle past the TTL (every other call does too); returns how many."""
        with self._lock:
            return self._expire_locked()

    def session_ids(self) -> list[str]:
        """Resident sessions, least recently used first."""
        with self._lock:
            self._expire_locked()
            return list(self._sessions)

    def session_stats(self) -> dict[str, Any]:
        """For metrics: sessions held, their bytes, those in use by a run (pinned), evictions (for room) and
        expirations (TTL) so far."""
        with self._lock:
            self._expire_locked()
            sessions = self._sessions.values()
            return {"sessions": len(sessions), "session_bytes": sum(s.handle.nbytes for s in sessions),
                    "pinned": sum(s.pins > 0 for s in sessions), "evictions": self.evictions,
                    "expirations": self.expirations, "session_ttl_s": self.session_ttl_s}

    def _expire_locked(self) -> int:
        now = self._clock()
        stale = [s.handle for s in self._sessions.values() if s.pins == 0 and now - s.last_used >= self.session_ttl_s]
        for handle in stale:
            self._release_locked(handle)
        self.expirations += len(stale)
        return len(stale)

    def _evict_locked(self, needed: int) -> None:
        """Evict idle sessions, least recently used first, until `needed` bytes are free (or none is left)."""
        for session in [s for s in self._sessions.values() if s.pins == 0]:
            if needed <= 0:
                return
            self._release_locked(session.handle)
            self.evictions += 1
            needed -= session.handle.nbytes

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
