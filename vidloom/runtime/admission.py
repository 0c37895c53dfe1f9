"""MemoryAdmission: the estimated peak bytes of every resident request, held against one device budget.

A card's estimator (ModelCard.memory_estimator) says what one resolved request needs beyond the
resident weights. Two checks use it, both in the runtime so the Python API, the AsyncEngine and the
server answer alike:

- alone: a request that would not fit even on an idle engine is refused when it is submitted
  (LimitExceeded naming width or num_frames, the server's 400), as it can never run;
- together: a request becomes resident only while the sum over resident (admitted, unfinished)
  requests stays within the budget. The AsyncEngine keeps it queued until room frees (a full queue
  is the server's 429); a caller stepping runs itself (the sync Engine) gets CacheBudgetExceeded.

Chats are on the same ledger (one ledger for every request kind): a chat holds its decode working set
(PagedDecoder.memory_bytes) while it is resident, so a video admitted next to running chats sees what they
hold, and a chat queued behind a large video waits for it. Their KV blocks are not counted here: the paged
pool holding them was allocated at load, before the budget was measured, so the budget already excludes it.

What outlives a run or belongs to none is on it too: the memory captured CUDA graphs keep (runtime.graph_memory, kind
"cuda graphs", grown and shrunk with `resize`), idle static buffers (runtime.static_buffers) and, for one step, a
batched forward's stacked inputs (runtime.worker_rounds).

Pure bookkeeping, no torch import: unit-tested with plain numbers.
"""

from __future__ import annotations

import threading
from typing import Hashable

from vidloom.core.errors import CacheBudgetExceeded
from vidloom.core.limits import format_bytes


BUDGET_NAME = "request memory budget"
"""The named limit: what the device had free after loading (runtime.memory.request_budget), shared by every
resident request of every kind."""


class MemoryAdmission:
    """Bytes reserved by resident requests against `budget_bytes` (None: not checked). Thread-safe."""

    def __init__(self, budget_bytes: int | None) -> None:
        if budget_bytes is not None and budget_bytes < 1:
            raise ValueError(f"budget_bytes must be >= 1 or None, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._held: dict[Hashable, int] = {}
        self._kinds: dict[Hashable, str] = {}  # owner -> what it is ("chat", "request"), for messages

    @property
    def in_use(self) -> int:
        """Bytes the resident requests' estimates add up to."""
        with self._lock:
            return sum(self._held.values())

    def held_by(self, kind: str) -> int:
        """Bytes the resident owners of one kind hold (e.g. "chat")."""
        with self._lock:
            return sum(n for owner, n in self._held.items() if self._kinds.get(owner) == kind)

    @property
    def resident(self) -> int:
        with self._lock:
            return len(self._held)

    def try_reserve(self, owner: Hashable, nbytes: int, kind: str = "request") -> bool:
        """Reserve `nbytes` for `owner` (a `kind` of work: "request", "chat") if the sum stays within the budget;
        True when held (also if already).

        An owner alone larger than the whole budget is still admitted on an idle engine: the alone check
        refuses such requests at submission, so one reaching here met a budget that has since shrunk.
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            if owner in self._held:
                return True
            used = sum(self._held.values())
            if self.budget_bytes is not None and self._held and used + nbytes > self.budget_bytes:
                return False
            self._held[owner] = nbytes
            self._kinds[owner] = kind
            return True

    def resize(self, owner: Hashable, nbytes: int, kind: str, force: bool = False) -> bool:
        """Set `owner`'s bytes to `nbytes` (0: release) when the sum stays within the budget, or when it shrinks;
        False (nothing changed) otherwise. Unlike `try_reserve`, an idle engine is no exception: what captured
        graphs keep (runtime.graph_memory) grows this way. `force`: set it anyway, for memory already held that
        the ledger must see even over the budget (requests then wait until it is released)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            before = self._held.get(owner, 0)
            used = sum(self._held.values()) - before
            if (not force and nbytes > before and self.budget_bytes is not None
                    and used + nbytes > self.budget_bytes):
                return False
            if nbytes == 0:
                self._held.pop(owner, None)
                self._kinds.pop(owner, None)
            else:
                self._held[owner] = nbytes
                self._kinds[owner] = kind
            return True

    def free_bytes(self) -> int | None:
        """What the budget has left now (None: not checked)."""
        return None if self.budget_bytes is None else max(0, self.budget_bytes - self.in_use)

    def reserve(self, owner: Hashable, nbytes: int, kind: str = "request") -> None:
        """`try_reserve`, or CacheBudgetExceeded with the numbers when the resident requests leave no room."""
        if self.try_reserve(owner, nbytes, kind):
            return
        used = self.in_use
        budget = self.budget_bytes or 0
        raise CacheBudgetExceeded(nbytes, used, budget, reason=(
            f"the {kind} needs an estimated {format_bytes(nbytes)} but only {format_bytes(max(0, budget - used))} "
            f"of the {format_bytes(budget)} {BUDGET_NAME} are free ({format_bytes(used)} held by "
            f"{self._holders()}); retry when one finishes, or ask for fewer frames, pixels or tokens"))

    def _holders(self) -> str:
        with self._lock:
            kinds = list(self._kinds.values())
        counts = {kind: kinds.count(kind) for kind in dict.fromkeys(kinds)}
        # Runs by count; what outlives them (captured graphs, idle static buffers) by bytes.
        return ", ".join(f"{n} running {kind}(s)" if kind in ("request", "chat") else
                         f"{kind} ({format_bytes(self.held_by(kind))})" for kind, n in counts.items()) or "nothing"

    def release(self, owner: Hashable) -> None:
        """Give back `owner`'s bytes (no-op if it holds none): on finish, failure and cancel alike."""
        with self._lock:
            self._held.pop(owner, None)
            self._kinds.pop(owner, None)
