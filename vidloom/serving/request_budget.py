"""A time budget per speech run (`max_request_seconds`): POST /v1/audio/speech and chats answered aloud.

A speech run's time grows with what it says (a 4,096-character input took 112 s on CPU), so two checks:

- up front: the server measures its own pace from the runs it completes (wall seconds per unit of work: a
  character of `input` for speech, a token of `max_tokens` for a spoken chat; an exponential moving average
  per kind). Once a kind has a measured pace, a request whose units at that pace exceed the budget is a 400
  naming the field that sizes it (`input`, `max_tokens`), before anything runs (a spoken chat's before its
  media parts are read: chat_routes). Until then only the next check
  applies; a card declares no pace, as it depends on the device.
- while running: a run still going when the budget is spent is cancelled on the engine (its KV returns at the
  next step) and answered 504 `deadline_exceeded`; a streamed answer ends with that error
  at its next piece.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

from vidloom.core.errors import LimitExceeded
from vidloom.serving.errors import APIError

LIMIT_NAME = "max_request_seconds"
PACE_WEIGHT = 0.3  # the newest run's share of the moving average
T = TypeVar("T")


class RequestBudget:
    """`seconds` (None: no budget) and the measured pace of each kind of run. Thread-safe."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._pace: dict[str, float] = {}
        self._lock = threading.Lock()

    def pace(self, kind: str) -> float | None:
        """Measured wall seconds per unit of `kind` ("speech", "audio_chat"), or None before any run."""
        with self._lock:
            return self._pace.get(kind)

    def check(self, kind: str, units: int, field: str, unit: str) -> None:
        """LimitExceeded(field) when `units` at the measured pace cannot finish within the budget."""
        pace = self.pace(kind)
        if self.seconds is None or pace is None:
            return
        expected = units * pace
        if expected > self.seconds:
            raise LimitExceeded(field, f"{units} {unit} would take about {expected:.0f} s at this server's measured "
                                       f"{pace:.3g} s per {unit.rstrip('s')}, more than its {self.seconds:g} s "
                                       f"budget ({LIMIT_NAME})", LIMIT_NAME)

    def observe(self, kind: str, units: int, seconds: float) -> None:
        """Fold one completed run (`units` in `seconds` of wall time) into `kind`'s pace."""
        if units < 1:
            return
        with self._lock:
            now = seconds / units
            old = self._pace.get(kind)
            self._pace[kind] = now if old is None else (1 - PACE_WEIGHT) * old + PACE_WEIGHT * now

    async def run(self, kind: str, units: Callable[[T], int], result: Awaitable[T], cancel: Callable[[], Any]) -> T:
        """`result` awaited within the budget, its pace observed (`units` of the result); past the budget
        `cancel()` and a 504."""
        started = time.perf_counter()
        try:
            value = await asyncio.wait_for(result, self.seconds)
        except asyncio.TimeoutError:
            cancel()
            raise self.exceeded() from None
        self.observe(kind, units(value), time.perf_counter() - started)
        return value

    def deadline(self) -> Deadline:
        """A streamed run's clock: checked as each piece leaves (a stream is stopped at its next piece)."""
        return Deadline(self, time.perf_counter())

    def exceeded(self) -> APIError:
        return APIError(504, f"the run was stopped after {self.seconds:g} s, this server's budget per speech "
                             f"request ({LIMIT_NAME}); ask for less text or fewer tokens", code="deadline_exceeded")


@dataclass
class Deadline:
    """A streamed run's start against its budget."""

    budget: RequestBudget
    started: float

    def check(self, cancel: Callable[[], Any]) -> None:
        """Past the budget: `cancel()` the run and raise the 504."""
        seconds = self.budget.seconds
        if seconds is not None and time.perf_counter() - self.started > seconds:
            cancel()
            raise self.budget.exceeded()

    def done(self, kind: str, units: int) -> None:
        self.budget.observe(kind, units, time.perf_counter() - self.started)
