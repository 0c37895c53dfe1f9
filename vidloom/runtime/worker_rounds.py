"""The AsyncEngine's device worker, its state and loop: each round, the decode step of every running sequence,
then the generation unit the policy picked (alone, or batched with compatible steps of other requests).

AsyncEngine (the front: submit, cancel, close) derives from it; only the worker thread runs the rounds.
Scheduler's docstring states the policy.
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
from vidloom.core.openmp import release_thread_pool
from vidloom.core.output import CancelledEvent, CompletedEvent, Event, EventCallback, FailedEvent, StartedEvent
from vidloom.runtime.admission import BUDGET_NAME
from vidloom.runtime.batching import BatchStats, batch_key, plan_rows, run_batched, stacked_bytes
from vidloom.runtime.request_run import RequestRun
from vidloom.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)

LORA_BATCHING = ("mixed", "grouped")
"""How policy "batch" batches runs with LoRA adapters: "mixed" (runs with different adapter sets share a forward,
each set applied to its own rows) or "grouped" (only runs with the same adapter set, names and scales, share one).
The default is the one bench/lora.py measured faster (docs/lora.md, "Batching")."""
DEFAULT_LORA_BATCHING = "mixed"
BATCHED_STEP = "batched-step"
"""The request memory ledger's entry for a batched step's stacked inputs (runtime.batching.stacked_bytes), held for
the step only."""
KV_WAIT_POLL_S = 0.01
"""A round in which nothing ran but requests waiting for paged KV blocks is followed by this pause (a submit ends
it early): blocks held outside the worker's runs (a run stepped on another thread) free at their own pace, and
retrying at once would only spin."""


@dataclass
class WorkEntry:
    """A submitted request of any kind, as the worker and the scheduler see it."""

    run: RequestRun  # (a ParallelRun on a pool: it only steps as a whole unit, RunHandle's defaults for the rest)
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
        return self.run.waiting_for_kv


class WorkerRounds:
    """The device worker's state, its loop and its rounds (see the module docstring); AsyncEngine is its front."""

    def __init__(self, engine: Any, policy: str, slots: int, queue_size: int, max_batch: int | None,
                 batch_wait_s: float, decode_slots: int, lora_batching: str) -> None:
        self.engine = engine
        self._scheduler: Scheduler[WorkEntry] = Scheduler(policy, slots, queue_size, decode_slots)
        self.max_batch = slots if max_batch is None else max_batch
        if self.max_batch < 1 or not 0.0 <= batch_wait_s < 60.0:
            raise ValueError(f"max_batch must be >= 1 and batch_wait_s in [0, 60), got {max_batch} and {batch_wait_s}")
        self.batch_wait_s = batch_wait_s
        if lora_batching not in LORA_BATCHING:
            raise ValueError(f"lora_batching must be one of {', '.join(LORA_BATCHING)}, got {lora_batching!r}")
        self.lora_batching = lora_batching
        self._batches = BatchStats()
        self._decodes = BatchStats()  # paged decode forwards and how many sequences each carried
        self._waited: tuple[str, int] | None = None  # (request, step) the batch wait last waited for
        self._entries: dict[str, WorkEntry] = {}
        self._cond = threading.Condition()
        self._closing = False
        # Running mean of completed jobs' wall time in a slot, for Retry-After; None until one completes.
        self._job_seconds: float | None = None
        # Device chores (a cancelled run's clean-up, releasing cached memory) that other threads
        # hand to the worker: only the worker touches the device, so nothing frees or synchronises
        # while it captures a CUDA graph.
        self._chores: list[Callable[[], None]] = []
        release_thread_pool()  # this thread loaded the model; the worker runs the forwards (core/openmp.py)
        self._thread = threading.Thread(target=self._work, name="vidloom-device-worker", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not self._entries and not self._chores:
                    self._cond.wait()
                chores, self._chores = self._chores, []
                if self._closing and not self._entries and not chores:
                    return
                for entry in self._scheduler.admit(_fits_in_memory):
                    entry.started = True
                    entry.admitted_at = time.perf_counter()
                    self._emit(entry, StartedEvent(entry.key))
                decode, entry = self._scheduler.round()
            for chore in chores:
                _run_chore(chore)
            self._decode_round(decode)  # cheap and latency-bound: every round (see Scheduler)
            if entry is not None and entry.key in self._entries:
                if self._scheduler.policy == "batch":
                    self._batch_round(entry)
                else:
                    self._step(entry)
            self._idle_wait(decode, entry)

    def _observe(self, seconds: float) -> None:
        with self._cond:
            mean = self._job_seconds
            self._job_seconds = seconds if mean is None else 0.8 * mean + 0.2 * seconds

    def _finish_locked(self, entry: WorkEntry, event: Event, outcome: object) -> None:
        with self._cond:
            self._finish(entry, event, outcome)

    def _finish(self, entry: WorkEntry, event: Event, outcome: object) -> None:
        """Release the request's slot and memory, report, resolve its future (lock held)."""
        self._scheduler.remove(entry.key)
        self._entries.pop(entry.key, None)
        if threading.current_thread() is self._thread:
            entry.run.close()
        else:  # cancel/close from another thread: the worker cleans up between its steps
            self._chores.append(entry.run.close)
            self._cond.notify()
        self._emit(entry, event)
        try:
            if isinstance(outcome, BaseException):
                entry.future.set_exception(outcome)
            else:
                entry.future.set_result(outcome)
        except concurrent.futures.InvalidStateError:
            pass  # the awaiting task was cancelled (its client left), which cancels the future: nobody reads it

    def _emit(self, entry: WorkEntry, event: Event) -> None:
        if entry.on_event is not None:
            entry.on_event(event)

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
        decoder = self.engine.decoder
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
        """Equal keys share a forward; None: alone, recorded on the run with why. "grouped" adds the run's adapter
        set to the key."""
        run, plan = entry.run, entry.run.pending_plan
        why = run.intercepted
        key = None if why else batch_key(plan)  # type: ignore[arg-type]
        if key is None:
            why = why or _unbatched(run, plan)
            if why:
                run.turn_off("batching", why)
            return None
        return key if self.lora_batching == "mixed" else (key, run.adapter_set)

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
        group = self._fit_stacked(group)
        if len(group) == 1:
            # Alone: through the run's own execute (its step cache, CUDA graphs, plan observer).
            self._batches.add(1)
            self._step(group[0])
            return
        plans = [e.run.pending_plan for e in group]
        runs = [e.run for e in group]
        started = time.perf_counter()
        results: list[Any] | None = None
        try:
            with torch.inference_mode(), runs[0].rows_scope(runs, [plan_rows(p) for p in plans]):  # type: ignore[arg-type]
                results = run_batched(plans)  # type: ignore[arg-type]
        except Exception:
            log.warning("batched step of %d requests failed; running them one by one", len(group), exc_info=True)
        finally:
            self.engine.admission.release(BATCHED_STEP)  # the stacked copy is gone with the step
        if results is None:  # failure isolation: rerun each alone, so only a request whose own step fails fails
            for entry in group:
                self._run_group([entry])
            return
        self._batches.add(len(group))
        share = (time.perf_counter() - started) / len(group)
        for entry, result in zip(group, results):
            if self._guarded(entry, lambda: entry.run.complete(result, share)) and entry.run.done:
                self._finish_completed(entry)

    def _fit_stacked(self, group: list[WorkEntry]) -> list[WorkEntry]:
        """The oldest members of `group` whose batched step's stacked copy (runtime.batching.stacked_bytes) fits the
        request memory ledger, reserved there under BATCHED_STEP until the step ends; the others wait for a later
        round. One member runs alone, copying nothing."""
        ledger = self.engine.admission
        fitted = group
        while len(fitted) > 1:
            nbytes = stacked_bytes([e.run.pending_plan for e in fitted])  # type: ignore[misc]
            if ledger.resize(BATCHED_STEP, nbytes, "batched step"):
                break
            fitted = fitted[:-1]
        if len(fitted) < len(group):
            self._batches.memory_splits += 1
            log.info("batched step cut from %d to %d requests: the stacked inputs of more do not fit the %s",
                     len(group), len(fitted), BUDGET_NAME)
        return fitted
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
            if self.engine.decoder is None:  # no paged pool, so no decode step to leave for the decode round
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


def _unbatched(run: RequestRun, plan: Any) -> str | None:
    """Why `plan`'s step runs alone: its card's reason, else that the step declares nothing to stack; None for a
    step the loop marks `runs_alone` on a card that batches (a causal rollout's KV prefill or chunk decode): the
    request's denoise steps still batch."""
    caps = run.instance.card.capabilities
    if "batching" not in caps.supported:
        return caps.why("batching")
    if plan.runs_alone:
        return None
    return f"the {plan.loop!r} step declares no inputs that stack with other requests' (runtime.batching)"


def _fits_in_memory(entry: WorkEntry) -> bool:
    """The runtime's memory admission (RequestRun.admit): resident estimates stay within the device budget."""
    return entry.run.admit()  # (a worker pool's run: the ranks hold the memory, always admitted here)


def _run_chore(chore: Callable[[], None]) -> None:
    try:
        chore()
    except Exception:  # a failed clean-up must not stop the worker
        log.exception("device worker chore failed")


def _code(exc: VidloomError) -> str:
    if isinstance(exc, InvalidRequest):
        return "invalid_request"
    if isinstance(exc, NonFiniteOutput):
        return "non_finite_output"
    return "generation_error"
