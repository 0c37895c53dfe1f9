"""What the AsyncEngine's device worker runs each round: the decode step of every running sequence, then the
generation unit the policy picked (alone, or batched with compatible steps of other requests).

Mixed into AsyncEngine, whose scheduler, entries, condition and finish path these use; only the worker
thread calls them. Scheduler's docstring states the policy.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from vidloom.core.errors import Cancelled, InvalidRequest, NonFiniteOutput, VidloomError
from vidloom.core.loop import is_decode_step
from vidloom.core.output import CancelledEvent, CompletedEvent, Event, EventCallback, FailedEvent
from vidloom.runtime.batching import BatchStats, batch_key, plan_rows, run_batched
from vidloom.runtime.engine import RequestRun
from vidloom.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)

LORA_BATCHING = ("mixed", "grouped")
"""How policy "batch" batches runs with LoRA adapters: "mixed" (runs with different adapter sets share a forward,
each set applied to its own rows) or "grouped" (only runs with the same adapter set, names and scales, share one).
The default is the one bench/lora.py measured faster (docs/lora.md, "Batching")."""
DEFAULT_LORA_BATCHING = "mixed"
KV_WAIT_POLL_S = 0.01
"""A round in which nothing ran but requests waiting for paged KV blocks is followed by this pause (a submit ends
it early): blocks held outside the worker's runs (a run stepped on another thread) free at their own pace, and
retrying at once would only spin."""


@dataclass
class WorkEntry:
    """A submitted request of any kind, as the worker and the scheduler see it."""

    run: RequestRun
    on_event: EventCallback | None
    result: Callable[[dict[str, Any]], Any]  # the finished run's outputs -> what its future resolves to
    decoder: bool = False  # an AR sequence (a chat): holds a decode slot, steps in every round's decode batch
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    started: bool = False
    admitted_at: float = 0.0  # perf_counter when it took a slot
    decoding: bool = False  # a generation request inside a paged decode loop (a reasoner): in the decode batch

    @property
    def key(self) -> str:
        return self.run.request.request_id

    @property
    def waiting(self) -> bool:
        """Its next loop waits for paged KV blocks that running sequences hold (RequestRun.kv_wait)."""
        return bool(getattr(self.run, "waiting_for_kv", False))


class WorkerRounds:
    """The worker's rounds (see the module docstring)."""

    engine: Any
    max_batch: int
    batch_wait_s: float
    lora_batching: str
    _scheduler: Scheduler[WorkEntry]
    _entries: dict[str, WorkEntry]
    _cond: threading.Condition
    _closing: bool
    _waited: tuple[str, int] | None
    _batches: BatchStats
    _decodes: BatchStats
    _finish_locked: Callable[[WorkEntry, Event, object], None]  # AsyncEngine's finish path (takes the lock)
    _observe: Callable[[float], None]  # AsyncEngine's job-time estimate (Retry-After)

    @property
    def engine_decoder(self) -> Any:
        """The engine's paged decoder (None: this engine runs no AR loop, e.g. a multi-device engine)."""
        return getattr(self.engine, "decoder", None)

    def _decode_round(self, residents: list[WorkEntry]) -> None:
        """One decode step of every running AR sequence (chats, generation requests in a paged decode loop),
        in one forward; a sequence that just joined prefills in it. A request waiting for KV blocks retries its
        reservation here, once a round: one that gets them decodes at once."""
        for entry in residents:
            if entry.run.pending_plan is None and not self._guarded(entry, entry.run.prepare):
                continue
            if entry.run.done:
                self._finish_completed(entry)
            else:  # False: its decode loop ended, back to the policy's turns
                entry.decoding = is_decode_step(entry.run.pending_plan)
        group = [e for e in residents if e.key in self._entries and is_decode_step(e.run.pending_plan)]
        if group:
            self._run_decode(group)

    def _idle_wait(self, decode: list[WorkEntry], picked: WorkEntry | None) -> None:
        """After a round: pause `KV_WAIT_POLL_S` when its only work was waiting requests retrying their KV."""
        with self._cond:
            live = [e for e in decode if e.key in self._entries]
            if picked is None and live and all(e.waiting for e in live):
                self._cond.wait(KV_WAIT_POLL_S)

    def _run_decode(self, group: list[WorkEntry]) -> None:
        decoder = self.engine_decoder
        plans = [e.run.pending_plan for e in group]
        started = time.perf_counter()
        try:
            rows = decoder.run(plans)
        except Exception as exc:
            if len(group) == 1:
                self._fail(group[0], exc)
                return
            # Failure isolation: rerun each alone, so only a sequence whose own step fails fails.
            log.warning("batched decode step of %d sequences failed; running them one by one", len(group))
            for entry in group:
                self._run_decode([entry])
            return
        for forward in decoder.groups(plans):  # one forward per network (chats and thinkers; talkers)
            self._decodes.add(len(forward))
        share = (time.perf_counter() - started) / len(group)
        for entry, row in zip(group, rows):
            if not self._guarded(entry, lambda: entry.run.complete(row, share)):
                continue
            # A chat plans its next step now (no kernels run): one that just ended resolves before the
            # round's denoise step rather than after it.
            if entry.decoder and self._guarded(entry, entry.run.prepare) and entry.run.done:
                self._finish_completed(entry)

    def _batch_round(self, first: WorkEntry) -> None:
        """Bring every resident generation request to its next loop step (running its component nodes), then
        run `first`'s step together with the compatible steps of others, oldest first."""
        with self._cond:
            residents = [e for e in self._scheduler.residents() if not e.decoder and not e.waiting]
        for entry in residents:  # (a waiting one retries in the decode round)
            if entry.run.pending_plan is None and not self._guarded(entry, entry.run.prepare):
                continue
            if entry.run.done:
                self._finish_completed(entry)
            entry.decoding = is_decode_step(entry.run.pending_plan)
        plan = first.run.pending_plan
        if plan is None or first.decoding:
            return  # it ran a component node this round (its unit of work), or it decodes with the chats
        with self._cond:
            residents = [e for e in self._scheduler.residents()
                         if not e.decoder and not e.decoding and e.run.pending_plan is not None]
            keys = {e.key: self._batch_key(e) for e in residents}
            group = self._scheduler.group(first, keys, self.max_batch)
            if self._should_wait(first, plan.index, len(group)):
                self._cond.wait(self.batch_wait_s)  # a submit notifies: the next round admits it
                return
        self._run_group(group)

    def _batch_key(self, entry: WorkEntry) -> Any:
        """Equal keys share a forward; None: alone. "grouped" adds the run's adapter set to the key."""
        if entry.run.intercepted:
            return None
        key = batch_key(entry.run.pending_plan)  # type: ignore[arg-type]
        if key is None or self.lora_batching == "mixed":
            return key
        return (key, entry.run.adapter_set)

    def _should_wait(self, first: WorkEntry, index: int, size: int) -> bool:
        """Lock held. Wait once per step, only with room in the batch and in the slots, nothing queued."""
        if self.batch_wait_s <= 0 or size >= self.max_batch or self._closing:
            return False
        if self._scheduler.waiting or self._scheduler.resident_of(False) >= self._scheduler.slots:
            return False
        if self._waited == (first.key, index):
            return False
        self._waited = (first.key, index)
        return True

    def _run_group(self, group: list[WorkEntry]) -> None:
        if len(group) == 1:
            # Alone: through the run's own execute (its step cache, CUDA graphs, plan observer).
            self._batches.add(1)
            self._step(group[0])
            return
        plans = [e.run.pending_plan for e in group]
        runs = [e.run for e in group]
        started = time.perf_counter()
        try:
            with torch.inference_mode(), runs[0].rows_scope(runs, [plan_rows(p) for p in plans]):  # type: ignore[arg-type]
                results = run_batched(plans)  # type: ignore[arg-type]
        except Exception:
            # Failure isolation: rerun each alone, so only a request whose own step fails fails.
            log.warning("batched step of %d requests failed; running them one by one", len(group), exc_info=True)
            for entry in group:
                self._run_group([entry])
            return
        self._batches.add(len(group))
        share = (time.perf_counter() - started) / len(group)
        for entry, result in zip(group, results):
            if self._guarded(entry, lambda: entry.run.complete(result, share)) and entry.run.done:
                self._finish_completed(entry)

    def _guarded(self, entry: WorkEntry, work: Callable[[], object]) -> bool:
        """Run `work` for `entry`; on an error finish the request with it and return False."""
        try:
            work()
            return True
        except Exception as exc:
            self._fail(entry, exc)
        return False

    def _fail(self, entry: WorkEntry, exc: Exception) -> None:
        """Finish `entry` with `exc`: cancelled, failed with its code, or an internal error (logged)."""
        if isinstance(exc, Cancelled):
            self._finish_locked(entry, CancelledEvent(entry.key), exc)
        elif isinstance(exc, VidloomError):
            self._finish_locked(entry, FailedEvent(entry.key, _code(exc), str(exc)), exc)
        else:
            log.error("request %s failed", entry.key, exc_info=exc)
            self._finish_locked(entry, FailedEvent(entry.key, "internal_error", f"{type(exc).__name__}: {exc}"), exc)

    def _finish_completed(self, entry: WorkEntry) -> None:
        output: list[Any] = []
        if self._guarded(entry, lambda: output.append(entry.result(entry.run.outputs()))):
            if not entry.decoder:  # Retry-After estimates a generation's time in a slot
                self._observe(time.perf_counter() - entry.admitted_at)
            self._finish_locked(entry, CompletedEvent(entry.key, output[0]), output[0])

    def _step(self, entry: WorkEntry) -> None:
        """One unit of a generation request; a paged decode step it plans waits for the decode round."""
        run = entry.run

        def unit() -> None:
            if self.engine_decoder is None:  # no paged pool, so no decode step to leave for the decode round
                run.step()  # (a multi-device engine's run steps only as a whole unit)
                return
            if run.pending_plan is None and not run.prepare():
                return  # a component node ran (or the program ended)
            if is_decode_step(run.pending_plan):
                entry.decoding = True  # it steps with the chats from now on
                return
            run.step()

        if self._guarded(entry, unit) and run.done:
            self._finish_completed(entry)


def _code(exc: VidloomError) -> str:
    if isinstance(exc, InvalidRequest):
        return "invalid_request"
    if isinstance(exc, NonFiniteOutput):
        return "non_finite_output"
    return "generation_error"
