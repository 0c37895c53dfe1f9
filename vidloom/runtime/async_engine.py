"""AsyncEngine: a device worker thread runs model steps; callers queue, await and stream.

The asyncio side never runs a model step: `submit` (every request kind; `chat` streams a chat's) validates
and enqueues into one scheduler, the worker thread advances resident requests at step boundaries (every round:
one batched decode step of all running AR sequences, then one generation unit the policy picks;
see Scheduler), and results come back through thread-safe futures. Every request kind is counted,
cancelled (`cancel(request_id)`) and cleaned up through the same paths.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import time
from typing import Any, Callable

from vidloom.core.card import ModelCard
from vidloom.core.chat import ChatRequest
from vidloom.core.errors import Cancelled, VidloomError
from vidloom.core.output import CancelledEvent, Event, EventCallback
from vidloom.core.speech import SpeechRequest
from vidloom.runtime.cache_manager import CacheManager
from vidloom.runtime.chat_stream import ChatFrontend, Offload
from vidloom.runtime.engine import Engine, RequestRun
from vidloom.runtime.paged_decode import PagedDecoder
from vidloom.runtime.results import result_of
from vidloom.runtime.scheduler import DEFAULT_DECODE_SLOTS, QueueFull
from vidloom.runtime.worker_rounds import DEFAULT_LORA_BATCHING, WorkEntry, WorkerRounds

log = logging.getLogger(__name__)


class EngineBusy(VidloomError):
    """The queue is full; `retry_after_s` estimates when a place frees up."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineClosed(VidloomError):
    """The engine is shutting down and takes no new work."""


class JobHandle:
    """A submitted request of any kind: its resolved parameters and its eventual result."""

    def __init__(self, entry: WorkEntry) -> None:
        self._entry = entry

    @property
    def request(self) -> Any:
        return self._entry.run.request

    @property
    def request_id(self) -> str:
        return self._entry.key

    @property
    def run(self) -> Any:
        """Its started run (what a stopped chat had written is read from it)."""
        return self._entry.run

    async def result(self) -> Any:
        """Its result (a VideoOutput, ChatResult or SpeechResult); raises Cancelled, or the error it failed with."""
        return await asyncio.wrap_future(self._entry.future)

    def wait(self, timeout: float | None = None) -> Any:
        """Blocking form of `result` for non-async callers."""
        return self._entry.future.result(timeout)


class AsyncEngine(ChatFrontend, WorkerRounds):
    """The EngineAPI over a device worker (WorkerRounds) that steps `engine` (an Engine or a ParallelEngine):
    generation and speech requests occupy `slots`, chats `decode_slots`, at most `queue_size` of either wait
    (chat: see ChatFrontend)."""

    def __init__(
        self,
        engine: Any,
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
        super().__init__(engine, policy, slots, queue_size, max_batch, batch_wait_s, decode_slots, lora_batching)

    # -- EngineAPI: the wrapped engine's model, decoder, caches and estimator -------------

    @property
    def instance(self) -> Any:
        return self.engine.instance

    @property
    def card(self) -> ModelCard:
        return self.engine.card

    @property
    def program(self) -> Any:
        return self.engine.program

    @property
    def decoder(self) -> PagedDecoder | None:
        return self.engine.decoder

    @property
    def caches(self) -> CacheManager | None:
        return self.engine.caches

    @property
    def estimator(self) -> Callable[[Any], int] | None:
        return self.engine.estimator

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

    def submit(self, work: Any, on_event: EventCallback | None = None,
               result: Callable[[dict[str, Any]], Any] | None = None, resolved: bool = False) -> JobHandle:
        """Validate and enqueue a request of any kind (GenerationRequest, ChatRequest, SpeechRequest). Raises
        InvalidRequest, EngineBusy (queue full) or EngineClosed at once; its handle resolves to its result
        (runtime.results.result_of; `result`: another reading of the finished run's output slots). `resolved`:
        a generation request the caller resolved against this model's card already (the server's boundary).

        `on_event` is called from the worker thread: keep it quick and thread-safe.
        """
        callback = _guarded(on_event) if on_event is not None else None
        run = self.engine.submit(work, callback, resolved=True) if resolved else self.engine.submit(work, callback)
        return self._enqueue_run(work, run, callback, result)

    async def submit_prepared_by(self, work: Any, offload: Offload, on_event: EventCallback | None = None) -> JobHandle:
        """As `submit`, with the request's preparation (a chat's prompt, a model's audio features and image
        patches) run by `offload(fn, *args)` (a thread pool's run), so no such work runs on the event loop."""
        callback = _guarded(on_event) if on_event is not None else None
        return self._enqueue_run(work, await offload(self.engine.submit, work, callback), callback)

    def _enqueue_run(self, work: Any, run: RequestRun, callback: EventCallback | None,
                     result: Callable[[dict[str, Any]], Any] | None = None) -> JobHandle:
        """A chat holds a decode slot and steps in every round's decode batch; any other kind takes a generation
        slot. A speech run whose talker finds the paged KV pool busy waits, retried each round, rather than
        failing (RequestRun.kv_wait)."""
        if isinstance(work, SpeechRequest):
            run.kv_wait = True
        entry = WorkEntry(run, callback, result or result_of(self.card, work), decoder=isinstance(work, ChatRequest))
        return self._enqueue(entry)

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
        return self.engine.compile_misses

    def release_memory(self) -> concurrent.futures.Future:
        """Return cached device memory to the driver, on the worker between steps; resolves when done."""
        done: concurrent.futures.Future = concurrent.futures.Future()

        def chore() -> None:
            self.engine.release_memory()
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

    @property
    def batch_stats(self) -> dict[str, float]:
        """Forwards run by the batch policy and their mean size (1.0: nothing was shared)."""
        return self._batches.summary()

    @property
    def decode_stats(self) -> dict[str, float]:
        """Paged decode forwards (chats and reasoners together) and how many sequences they carried."""
        return self._decodes.summary()

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


def _guarded(callback: EventCallback) -> EventCallback:
    """A subscriber's bug must not fail the request or stop the worker."""

    def call(event: Event) -> None:
        try:
            callback(event)
        except Exception:
            log.exception("event callback failed on %s", type(event).__name__)

    return call
