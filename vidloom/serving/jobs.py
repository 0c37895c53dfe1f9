"""JobManager: video jobs on the AsyncEngine, with worker-thread events bridged to asyncio, stored and fanned out.

Threading: the device worker calls `_bridge`, which only hands the event to the event
loop (`call_soon_threadsafe`); every state change, store write and subscriber fan-out
then happens on the loop thread, in event order. Store writes are single-row commits
(WAL), small enough to run there; the mp4 encode runs in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from vidloom.core.errors import Cancelled, InvalidRequest
from vidloom.core.output import (
    CancelledEvent, CompletedEvent, Event, FailedEvent, ProgressEvent, StartedEvent, VideoOutput,
)
from vidloom.core.request import GenerationRequest
from vidloom.media.video import write_png, write_video
from vidloom.runtime.async_engine import AsyncEngine, EngineBusy, JobHandle
from vidloom.runtime.engine import Engine
from vidloom.serving.config import ServeConfig
from vidloom.serving.job_store import JobRecord, JobStore
from vidloom.serving.metrics import ServerMetrics
from vidloom.serving.params import PlannedVideo
from vidloom.serving.progress import ProgressTracker, expected_units

log = logging.getLogger(__name__)

# Jobs unfinished when a server stops (gracefully, or found at the next start after a crash).
SERVER_RESTART = ("server_restart", "the server stopped before this job finished; submit it again")


@dataclass(frozen=True)
class JobUpdate:
    """What event subscribers receive: a progress tick, or the job's final state."""

    event: str  # progress | completed | failed | cancelled
    record: JobRecord
    phase: str | None = None
    step: int = 0  # steps done in `phase`
    total: int = 0  # steps in `phase`


@dataclass(frozen=True)
class Subscription:
    """The job's state at subscription time, then (while it runs) a queue of further updates."""

    first: JobUpdate
    updates: asyncio.Queue[JobUpdate] | None  # None: the job had already finished


@dataclass
class _LiveJob:
    record: JobRecord  # mirrors the stored row (every change is written through)
    tracker: ProgressTracker
    submitted: float  # perf_counter at submission, for the job latency metric
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    subscribers: set[asyncio.Queue[JobUpdate]] = field(default_factory=set)


class JobManager:
    """Owns the AsyncEngine, the job store and the metrics of one server."""

    def __init__(self, engine: Engine, config: ServeConfig, loop: asyncio.AbstractEventLoop) -> None:
        card = engine.instance.card  # the name the API shows (model fields, /v1/models) may be --served-model-name
        self.card = dataclasses.replace(card, model_id=config.served_model_name) if config.served_model_name else card
        self._config = config
        self._loop = loop
        self.store = JobStore(config.data_dir)
        failed = self.store.recover(_now(), *SERVER_RESTART)
        if failed:
            log.warning("marked %d job(s) left unfinished by a previous server as failed (server_restart)", failed)
        self._engine = AsyncEngine(engine, policy=config.policy, slots=config.slots, queue_size=config.queue_size)
        self.metrics = ServerMetrics(lambda: self._engine.queue_depth, lambda: self._engine.in_flight)
        self._live: dict[str, _LiveJob] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    @property
    def queue_depth(self) -> int:
        return self._engine.queue_depth

    @property
    def in_flight(self) -> int:
        return self._engine.in_flight

    # -- requests from the HTTP side (event loop thread) -----------------------------

    def submit_video(self, planned: PlannedVideo) -> JobRecord:
        """Validate, enqueue and store a job. Raises InvalidRequest or EngineBusy before storing anything."""
        resolved = self._submit(planned.request).request
        record = JobRecord(
            id=resolved.request_id, model=self.card.model_id, status="queued", progress=0, created_at=_now(),
            completed_at=None, size=planned.size, seconds=planned.seconds, prompt=resolved.prompt,
            params=request_params(resolved),
        )
        try:
            self.store.add(record)
        except BaseException:
            self._engine.cancel(record.id)  # never run a job nobody can see
            raise
        tracker = ProgressTracker(expected_units(resolved, self.card))
        self._live[record.id] = _LiveJob(record, tracker, time.perf_counter())
        return record

    async def generate_image(self, request: GenerationRequest) -> VideoOutput:
        """Run a request to completion (not stored: images answer in the same HTTP call)."""
        handle = self._submit(request)
        started, status = time.perf_counter(), "failed"
        try:
            output = await handle.result()
            status = "completed"
            return output
        except Cancelled:
            status = "cancelled"
            raise
        except asyncio.CancelledError:  # the client went away: free the slot
            self._engine.cancel(request.request_id)
            status = "cancelled"
            raise
        finally:
            self.metrics.finished("image", status, time.perf_counter() - started)

    def get(self, job_id: str) -> JobRecord | None:
        live = self._live.get(job_id)
        return live.record if live is not None else self.store.get(job_id)

    async def cancel(self, job_id: str) -> JobRecord | None:
        """Cancel an active job and wait (up to cancel_wait_s) for the step boundary where it stops."""
        live = self._live.get(job_id)
        if live is None:
            return self.store.get(job_id)
        self._engine.cancel(job_id)
        try:
            await asyncio.wait_for(live.finished.wait(), self._config.cancel_wait_s)
        except TimeoutError:
            pass  # still mid-step: it becomes cancelled at the boundary; the caller sees in_progress
        return live.record

    def delete(self, job_id: str) -> bool:
        """Cancel the job if active, then drop its row and files. False if there was no such job."""
        live = self._live.get(job_id)
        if live is not None:
            self._engine.cancel(job_id)
            self._end(live, dataclasses.replace(live.record, status="cancelled", completed_at=_now()))
        return self.store.delete(job_id)

    def subscribe(self, job_id: str) -> Subscription | None:
        """None for an unknown job. Runs on the loop thread, so no update slips between snapshot and queue."""
        live = self._live.get(job_id)
        if live is None:
            record = self.store.get(job_id)
            if record is None:
                return None
            # Not live means finished, except in the moment between engine stop and store close.
            return Subscription(JobUpdate(record.status if record.finished else "progress", record), None)
        queue: asyncio.Queue[JobUpdate] = asyncio.Queue()
        live.subscribers.add(queue)
        t = live.tracker
        return Subscription(JobUpdate("progress", live.record, t.phase, t.step, t.total), queue)

    def unsubscribe(self, job_id: str, queue: asyncio.Queue[JobUpdate]) -> None:
        live = self._live.get(job_id)
        if live is not None:
            live.subscribers.discard(queue)

    async def close(self) -> None:
        """Stop the engine, let result files being written finish, fail what is left (server_restart)."""
        self._closing = True
        await asyncio.to_thread(self._engine.close)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for live in list(self._live.values()):
            self._finish(live, "failed", error=SERVER_RESTART)
        self.store.close()

    def _submit(self, request: GenerationRequest) -> JobHandle:
        try:
            return self._engine.submit(request, self._bridge)
        except EngineBusy:
            self.metrics.rejected("queue_full")
            raise
        except InvalidRequest:
            self.metrics.rejected("invalid_request")
            raise

    # -- engine events ----------------------------------------------------------------

    def _bridge(self, event: Event) -> None:
        """Called on the device worker thread: hand over to the loop and return at once."""
        try:
            self._loop.call_soon_threadsafe(self._dispatch, event)
        except RuntimeError:
            pass  # the loop is closed (shutdown): nobody is listening any more

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, ProgressEvent):
            self.metrics.step(event.phase, event.seconds)
        live = None if self._closing else self._live.get(event.request_id)
        if live is None:
            return  # an image request, a deleted job, or shutdown
        if isinstance(event, StartedEvent):
            self._write(live, status="in_progress")
            self._publish(live, JobUpdate("progress", live.record))
        elif isinstance(event, ProgressEvent):
            percent = live.tracker.update(event.phase, event.step, event.total)
            if percent != live.record.progress:
                self._write(live, progress=percent)
            self._publish(live, JobUpdate("progress", live.record, event.phase, event.step, event.total))
        elif isinstance(event, CompletedEvent):
            task = self._loop.create_task(self._save(live, event.output))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif isinstance(event, FailedEvent):
            self._finish(live, "failed", error=(event.code, event.message))
        elif isinstance(event, CancelledEvent):
            self._finish(live, "cancelled")

    async def _save(self, live: _LiveJob, output: VideoOutput) -> None:
        """Write mp4 + thumbnail atomically off the loop; only then is the job completed."""
        job_id = live.record.id
        try:
            await asyncio.to_thread(self._write_files, job_id, output)
        except Exception as exc:
            log.exception("writing the result of %s failed", job_id)
            self._finish(live, "failed", error=("output_error", f"could not write the video: {exc}"))
            return
        if self._live.get(job_id) is not live:  # deleted while encoding
            self.store.remove_files(job_id)
            return
        self._finish(live, "completed", metadata=output.metadata)

    def _write_files(self, job_id: str, output: VideoOutput) -> None:
        write_png(output.frames[0], self.store.thumbnail_path(job_id))
        write_video(output.frames, output.fps, self.store.video_path(job_id))

    def _write(self, live: _LiveJob, *, status: str | None = None, progress: int | None = None) -> None:
        if status is not None:
            self.store.set_status(live.record.id, status)
            live.record = dataclasses.replace(live.record, status=status)
        if progress is not None:
            self.store.set_progress(live.record.id, progress)
            live.record = dataclasses.replace(live.record, progress=progress)

    def _finish(
        self, live: _LiveJob, status: str, *, metadata: Mapping[str, Any] | None = None,
        error: tuple[str, str] | None = None,
    ) -> None:
        now = _now()
        self.store.finish(live.record.id, status, now, metadata=metadata, error=error)
        code, message = error if error else (None, None)
        progress = 100 if status == "completed" else live.record.progress
        self._end(live, dataclasses.replace(
            live.record, status=status, completed_at=now, progress=progress, metadata=metadata,
            error_code=code, error_message=message,
        ))

    def _end(self, live: _LiveJob, final: JobRecord) -> None:
        """Forget the live job and tell its subscribers how it ended."""
        live.record = final
        self._live.pop(final.id, None)
        self.metrics.finished("video", final.status, time.perf_counter() - live.submitted)
        self._publish(live, JobUpdate(final.status, final))
        live.finished.set()

    def _publish(self, live: _LiveJob, update: JobUpdate) -> None:
        for queue in live.subscribers:
            queue.put_nowait(update)


def request_params(request: GenerationRequest) -> dict[str, Any]:
    """The resolved request as stored with the job: enough to run it again, seed included."""
    params = dataclasses.asdict(request)
    params.pop("request_id")
    params["task"] = request.task.value
    return params


def _now() -> int:
    return int(time.time())
