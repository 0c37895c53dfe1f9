"""AsyncEngine: a device worker thread runs model steps; callers queue, await and stream.

The asyncio side never runs a model step: `submit` (a generation) and `chat` validate and enqueue
into one scheduler, the worker thread advances resident requests at step boundaries (every round:
one batched decode step of all running AR sequences, then one generation unit the policy picks;
see Scheduler), and results come back through thread-safe futures. Every request kind is counted,
cancelled (`cancel(request_id)`) and cleaned up through the same paths.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from typing import Any, Callable

from vidloom.core.errors import Cancelled, VidloomError
from vidloom.core.output import CancelledEvent, Event, EventCallback, StartedEvent, VideoOutput
from vidloom.core.request import GenerationRequest
from vidloom.runtime.batching import BatchStats
from vidloom.runtime.chat_stream import ChatFrontend
from vidloom.runtime.engine import Engine, RequestRun
from vidloom.runtime.results import video_output
from vidloom.runtime.scheduler import DEFAULT_DECODE_SLOTS, QueueFull, Scheduler
from vidloom.runtime.worker_rounds import DEFAULT_LORA_BATCHING, LORA_BATCHING, WorkEntry, WorkerRounds

log = logging.getLogger(__name__)


class EngineBusy(VidloomError):
    """The queue is full; `retry_after_s` estimates when a place frees up."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineClosed(VidloomError):
    """The engine is shutting down and takes no new work."""


class JobHandle:
    """A submitted request: its resolved parameters and its eventual result."""

    def __init__(self, entry: WorkEntry) -> None:
        self._entry = entry

    @property
    def request(self) -> GenerationRequest:
        return self._entry.run.request

    @property
    def request_id(self) -> str:
        return self._entry.key

    async def result(self) -> VideoOutput:
        """The video; raises Cancelled, or the error the request failed with."""
        return await asyncio.wrap_future(self._entry.future)

    def wait(self, timeout: float | None = None) -> VideoOutput:
        """Blocking form of `result` for non-async callers."""
        return self._entry.future.result(timeout)


class AsyncEngine(ChatFrontend, WorkerRounds):
    """Owns one device worker; generation requests occupy `slots`, chats `decode_slots`, at most `queue_size`
    of either wait (chat: see ChatFrontend)."""

    def __init__(
        self,
        engine: Engine,
        *,
        policy: str = "fifo",
        slots: int = 1,
        queue_size: int = 16,
        max_batch: int | None = None,
        batch_wait_s: float = 0.0,
        decode_slots: int = DEFAULT_DECODE_SLOTS,
        lora_batching: str = DEFAULT_LORA_BATCHING,
    ) -> None:
        """policy "batch" runs compatible denoise steps of up to `max_batch` (default: `slots`) resident
        requests in one forward; before a step with room in its batch it waits up to `batch_wait_s`
        for more requests to arrive (0: never waits). `decode_slots`: chats decoding at once at most.
        `lora_batching`: which runs with LoRA adapters share a forward (worker_rounds.LORA_BATCHING)."""
        if policy == "batch" and not isinstance(engine, Engine):
            raise ValueError(f"policy 'batch' needs a one-device engine, got {type(engine).__name__}")
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
        self._thread = threading.Thread(target=self._work, name="vidloom-device-worker", daemon=True)
        self._thread.start()

    @property
    def policy(self) -> str:
        return self._scheduler.policy

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return self._scheduler.waiting

    @property
    def in_flight(self) -> int:
        """Resident requests of every kind (generations and chats)."""
        with self._cond:
            return self._scheduler.resident

    @property
    def chats_in_flight(self) -> int:
        """Resident chats (a part of in_flight)."""
        with self._cond:
            return self._scheduler.resident_of(True)

    def submit(self, request: GenerationRequest, on_event: EventCallback | None = None) -> JobHandle:
        """Validate and enqueue. Raises InvalidRequest, EngineBusy (queue full) or EngineClosed at once.

        `on_event` is called from the worker thread: keep it quick and thread-safe.
        """
        callback = _guarded(on_event) if on_event is not None else None
        card = self.engine.instance.card
        return self._enqueue(WorkEntry(self.engine.start(request, callback), callback,
                                    lambda outputs: video_output(card, outputs)))

    def submit_chat(self, run: RequestRun, on_event: EventCallback,
                    result: Callable[[dict[str, Any]], Any]) -> JobHandle:
        """Enqueue a chat's run (Engine.start_chat, started with `on_event`); it resolves to `result(outputs)`."""
        return self._enqueue(WorkEntry(run, _guarded(on_event), result, decoder=True))

    def submit_run(self, run: RequestRun, on_event: EventCallback | None,
                   result: Callable[[dict[str, Any]], Any]) -> JobHandle:
        """Enqueue a prepared run of any program (a speech request's): it takes a generation slot and its paged
        decode steps join every round's decode batch; it resolves to `result(outputs)`. A loop of it that finds
        its paged KV pool busy waits, retried each round, rather than failing (RequestRun.kv_wait)."""
        run.kv_wait = True
        return self._enqueue(WorkEntry(run, _guarded(on_event) if on_event is not None else None, result))

    def _enqueue(self, entry: WorkEntry) -> JobHandle:
        with self._cond:
            if self._closing:
                raise EngineClosed("engine is shutting down")
            try:
                self._scheduler.enqueue(entry)
            except QueueFull as exc:
                raise EngineBusy(str(exc), self._retry_after()) from None
            self._entries[entry.key] = entry
            self._cond.notify()
        return JobHandle(entry)

    def cancel(self, request_id: str) -> bool:
        """Queued: cancelled now. Running: at its next step boundary. False if unknown or finished."""
        with self._cond:
            entry = self._entries.get(request_id)
            if entry is None:
                return False
            if self._scheduler.is_waiting(request_id):
                self._finish(entry, CancelledEvent(request_id), Cancelled(f"request {request_id} was cancelled"))
                return True
            entry.run.cancel.cancel()
            return True

    @property
    def compile_misses(self) -> int:
        """Requests that ran eagerly outside the compiled shape buckets (0 without --compile)."""
        return getattr(self.engine, "compile_misses", 0)

    def release_memory(self) -> concurrent.futures.Future:
        """Return cached device memory to the driver, on the worker between steps; resolves when done."""
        done: concurrent.futures.Future = concurrent.futures.Future()

        def chore() -> None:
            release = getattr(self.engine, "release_memory", None)
            if release is not None:
                release()
            done.set_result(None)

        with self._cond:
            self._chores.append(chore)
            self._cond.notify()
        return done

    def cancel_chats(self) -> int:
        """Stop every queued or running chat at its next step (a server's shutdown); how many."""
        with self._cond:
            chats = [key for key, entry in self._entries.items() if entry.decoder]
        return sum(self.cancel(key) for key in chats)

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop taking work, cancel what is queued or running, and join the worker."""
        with self._cond:
            self._closing = True
            for entry in list(self._entries.values()):
                entry.run.cancel.cancel()
                if self._scheduler.is_waiting(entry.key):
                    self._finish(entry, CancelledEvent(entry.key), Cancelled("engine shut down"))
            self._cond.notify_all()
        self._thread.join(timeout)

    # -- worker thread ---------------------------------------------------------------

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

    @property
    def batch_stats(self) -> dict[str, float]:
        """Forwards run by the batch policy and their mean size (1.0: nothing was shared)."""
        return self._batches.summary()

    @property
    def decode_stats(self) -> dict[str, float]:
        """Paged decode forwards (chats and reasoners together) and how many sequences they carried."""
        return self._decodes.summary()

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

    def _retry_after(self) -> int:
        """Seconds until a queue place likely frees: when the oldest resident job finishes (lock held).

        From observed job times: the mean job time less what the oldest resident job has run
        already. Before any job completed, what that job has run so far is the best guess.
        """
        now = time.perf_counter()
        ran = max((now - e.admitted_at for e in self._entries.values() if e.started and not e.decoder), default=0.0)
        if self._job_seconds is None:
            return max(1, math.ceil(ran))
        return max(1, math.ceil(self._job_seconds - ran))


def _fits_in_memory(entry: WorkEntry) -> bool:
    """The runtime's memory admission (RequestRun.admit): resident estimates stay within the device budget."""
    admit = getattr(entry.run, "admit", None)  # a worker pool's run: the ranks hold the memory, not this process
    return admit() if admit is not None else True


def _run_chore(chore: Callable[[], None]) -> None:
    try:
        chore()
    except Exception:  # a failed clean-up must not stop the worker
        log.exception("device worker chore failed")


def _guarded(callback: EventCallback) -> EventCallback:
    """A subscriber's bug must not fail the request or stop the worker."""

    def call(event: Event) -> None:
        try:
            callback(event)
        except Exception:
            log.exception("event callback failed on %s", type(event).__name__)

    return call
