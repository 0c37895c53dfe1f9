"""JobManager: video jobs on the AsyncEngine, with worker-thread events bridged to asyncio, stored and fanned out.

Threading: the device worker calls `_bridge`, which only hands the event to the event
loop (`call_soon_threadsafe`); every state change, store write and subscriber fan-out
then happens on the loop thread, in event order. Store writes are single-row commits
(WAL), small enough to run there; the mp4 encode runs in a thread (`asyncio.to_thread`).

Store failures (disk full, read-only database) never strand a job: a job whose row cannot be
written is stopped and failed in memory (`storage_error`), its final state is kept in `_unsaved`
and written once the store accepts writes again; a create that cannot be stored is refused.
"""

from __future__ import annotations

import asyncio
import os
import socket
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import numpy as np

from vidloom.core.errors import Cancelled
from vidloom.core.output import (
    CancelledEvent, ChunkEvent, CompletedEvent, Event, FailedEvent, ProgressEvent, StartedEvent, TextEvent,
    VideoOutput,
)
from vidloom.core.request import GenerationRequest, Task, resolve_request
from vidloom.media.audio import AudioTrack, track_of, write_wav
from vidloom.core.session import VideoSession
from vidloom.media.video import write_png, write_video
from vidloom.runtime.async_engine import AsyncEngine, EngineClosed, JobHandle
from vidloom.runtime.cache_manager import CacheManager
from vidloom.runtime.engine import Engine
from vidloom.serving.action_results import save_actions
from vidloom.serving.chunk_stream import ChunkInfo, StreamFiles
from vidloom.serving.config import ServeConfig
from vidloom.serving.errors import redact_paths
from vidloom.serving.job_store import (
    STORE_ERRORS, JobRecord, JobStore, Page, StoreError, full_disk_error, open_job_store,
)
from vidloom.serving.kv_metrics import register_kv_metrics
from vidloom.serving.media_pool import MediaPool
from vidloom.serving.metrics import ServerMetrics
from vidloom.serving.params import PlannedVideo
from vidloom.serving.progress import ProgressTracker, expected_units
from vidloom.serving.update_queue import UpdateQueue
from vidloom.serving.video_sessions import expire_sessions, release_session, save_session

log = logging.getLogger(__name__)

# Jobs unfinished when a server stops (gracefully, or found at the next start after a crash).
CONTROL_POLL_S = 0.25  # how soon a cancel or delete sent to another server reaches the job's own server
SERVER_RESTART = ("server_restart", "the server stopped before this job finished; submit it again")


def open_store(config: ServeConfig) -> JobStore:
    """Open the job store and recover it after dead servers (raises StoreError on a bad or unreachable database)."""
    store = open_job_store(config.store, config.data_dir)
    try:
        recover_lost_jobs(store, config, tidy=True)
    except (*STORE_ERRORS, OSError) as exc:  # the first writes of a start: a full disk shows here too
        store.close()
        error = full_disk_error(f"job store in {config.data_dir}", config.data_dir, exc)
        raise error or StoreError(f"job store in {config.data_dir}: recovery after the last run failed "
                                  f"({exc})") from None
    return store


def recover_lost_jobs(store: JobStore, config: ServeConfig, *, tidy: bool = False) -> None:
    """Fail or re-queue (config.lost_jobs) the active jobs of servers that died."""
    done = store.recover(_now(), *SERVER_RESTART, requeue=config.lost_jobs == "requeue",
                         max_requeues=config.max_requeues, tidy=tidy)
    if done.failed:
        log.warning("marked %d job(s) left unfinished by a server that stopped as failed (server_restart)",
                    done.failed)
    if done.requeued:
        log.warning("re-queued %d job(s) left unfinished by a server that stopped", done.requeued)


@dataclass(frozen=True)
class JobUpdate:
    """What event subscribers receive: a progress tick, a decoded chunk, or the job's final state."""

    event: str  # progress | chunk | completed | failed | cancelled
    record: JobRecord
    phase: str | None = None
    step: int = 0  # steps done in `phase`
    total: int = 0  # steps in `phase`
    chunk: ChunkInfo | None = None  # for "chunk"
    missed_chunks: int = 0  # chunk updates this subscriber's queue dropped before this one (see UpdateQueue)
    text: str = ""  # a `reasoning` update: the text decoded since the last one


@dataclass(frozen=True)
class Subscription:
    """The job's state at subscription time, then (while it runs) a queue of further updates."""

    first: JobUpdate
    updates: UpdateQueue | None  # None: the job had already finished


@dataclass
class _LiveJob:
    record: JobRecord  # mirrors the stored row (every change is written through)
    tracker: ProgressTracker
    submitted: float  # perf_counter at submission, for the job latency metric
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    subscribers: set[UpdateQueue] = field(default_factory=set)


class JobManager:
    """Owns the AsyncEngine, the job store and the metrics of one server."""

    def __init__(
        self, engine: Engine, config: ServeConfig, loop: asyncio.AbstractEventLoop, store: JobStore | None = None,
    ) -> None:
        card = engine.instance.card  # the name the API shows (model fields, /v1/models) may be --served-model-name
        self.card = dataclasses.replace(card, model_id=config.served_model_name) if config.served_model_name else card
        self._config = config
        self._loop = loop
        self.store = store if store is not None else open_store(config)
        self._engine = AsyncEngine(engine, policy=config.policy, slots=config.slots, queue_size=config.queue_size,
                                   max_batch=config.max_batch, batch_wait_s=config.batch_wait_s)
        # The device's memory budget (one request alone, and the sum over resident ones) is the runtime's
        # (Engine.admission); here only an explicit max_request_memory_bytes, a server limit like max_pixels.
        self._estimator = getattr(engine, "estimator", None)
        self.limits = config.request_limits(self.card, None)
        self.metrics = ServerMetrics(lambda: self._engine.queue_depth, lambda: self._engine.in_flight,
                                     lambda: self._engine.compile_misses)
        self._caches: CacheManager | None = getattr(engine, "caches", None)  # KV slabs and resident sessions
        if self._caches is not None:
            register_kv_metrics(self.metrics.registry, self._caches)
        self._live: dict[str, _LiveJob] = {}
        # Upload checks and decodes, off the event loop; a queued job holds its files compressed (media.uploads).
        self.media = MediaPool(config.media_workers, config.media_queue)
        self.streams = StreamFiles(self.store.videos_dir)  # the growing fMP4 of each running job
        self._unsaved: dict[str, JobRecord] = {}  # final states the store refused; retried before each create
        self._images: set[str] = set()  # image requests being rendered (their HTTP call is waiting)
        self._tasks: set[asyncio.Task[None]] = set()
        self._draining = False
        self._closing = False
        self._sweeper: asyncio.Task[None] | None = None
        self._expirer: asyncio.Task[None] | None = None  # drops idle KV sessions on time, not at the next request
        self.server_name = f"{socket.gethostname()}:{os.getpid()}"  # in logs and a fleet's /metrics

    def start(self) -> None:
        """Run re-queued jobs of dead servers; on a shared store, keep looking for them while serving."""
        self.adopt_requeued()
        if self.store.shared:
            self._sweeper = self._loop.create_task(self._sweep())
        if self._caches is not None and self._caches.session_ttl_s > 0:
            self._expirer = self._loop.create_task(expire_sessions(self._caches))

    async def _sweep(self) -> None:
        """Shared store: act on other servers' cancels and deletes, recover dead servers' jobs, publish metrics."""
        last_recovery = 0.0
        while not self._draining:
            await asyncio.sleep(CONTROL_POLL_S)
            try:
                await self._apply_control()
                if self._loop.time() - last_recovery >= self._config.recovery_interval_s:
                    last_recovery = self._loop.time()
                    await asyncio.to_thread(recover_lost_jobs, self.store, self._config)
                    self.adopt_requeued()
                    await asyncio.to_thread(self.store.publish_server, self.server_name, self.card.model_id,
                                            self.metrics.exposition().decode(), _now())
            except STORE_ERRORS as exc:
                log.error("job store control poll failed (%s); retrying", exc)

    async def _apply_control(self) -> None:
        cancel, gone = await asyncio.to_thread(self.store.control, set(self._live))
        for job_id in cancel:
            self._engine.cancel(job_id)  # the CancelledEvent finishes it as usual
        for job_id in gone:  # deleted through another server, or failed by one that thought we were dead
            live = self._live.pop(job_id, None)
            if live is None:
                continue
            self._engine.cancel(job_id)
            self.streams.abort(job_id)
            live.finished.set()
            if await asyncio.to_thread(self.store.get, job_id) is None:
                await asyncio.to_thread(self.store.remove_files, job_id)
            log.info("stopped %s: its row was deleted or taken over by another server", job_id)

    def adopt_requeued(self) -> int:
        """Claim re-queued jobs and put them on this engine; a job that no longer fits here fails."""
        adopted = 0
        for record in self.store.claim_requeued():
            params = dict(record.params)
            params["task"] = Task(params["task"])
            try:
                if isinstance(params.get("extend_from"), str):  # its source's stored latents
                    params["extend_from"] = VideoSession.load(self.store.latents_path(params["extend_from"]))
                request = GenerationRequest(prompt=record.prompt, request_id=record.id, **params)
                resolved = self._submit(request).request
            except Exception as exc:  # InvalidRequest (new limits), EngineBusy, EngineClosed
                live = _LiveJob(record, ProgressTracker(1), time.perf_counter())
                self._finish(live, "failed", error=("requeue_failed", f"could not run this job again: {exc}"))
                continue
            tracker = ProgressTracker(expected_units(resolved, self.card))
            self._live[record.id] = _LiveJob(record, tracker, time.perf_counter())
            self.streams.open(record.id)
            adopted += 1
        if adopted:
            log.info("running %d re-queued job(s) of a server that stopped", adopted)
        return adopted

    @property
    def engine(self) -> AsyncEngine:
        """The engine, for routes that stream from it directly (chat)."""
        return self._engine

    @property
    def queue_depth(self) -> int:
        return self._engine.queue_depth

    @property
    def in_flight(self) -> int:
        return self._engine.in_flight

    # -- requests from the HTTP side (event loop thread) -----------------------------

    def submit_video(self, planned: PlannedVideo) -> JobRecord:
        """Validate, enqueue and store a job. Raises InvalidRequest or EngineBusy before storing anything."""
        self._flush_unsaved()
        resolved = self._submit(planned.request).request
        record = JobRecord(
            id=resolved.request_id, model=self.card.model_id, status="queued", progress=0, created_at=_now(),
            completed_at=None, size=planned.size, seconds=planned.seconds, prompt=resolved.prompt,
            params=request_params(resolved),
        )
        try:
            self.store.add(record)
        except BaseException as exc:
            self._engine.cancel(record.id)  # never run a job nobody can see
            if isinstance(exc, STORE_ERRORS):
                self.metrics.rejected("storage_error")
            raise
        tracker = ProgressTracker(expected_units(resolved, self.card))
        self._live[record.id] = _LiveJob(record, tracker, time.perf_counter())
        self.streams.open(record.id)
        return record

    async def generate_image(self, request: GenerationRequest, kind: str = "image") -> VideoOutput:
        """Run a request to completion (not stored: images answer in the same HTTP call; `kind` "session_chunk":
        a world-model session's chunk, answered on its WebSocket)."""
        handle = self._submit(request)
        started, status = time.perf_counter(), "failed"
        self._images.add(request.request_id)
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
            self._images.discard(request.request_id)
            self.metrics.finished(kind, status, time.perf_counter() - started)

    async def generate_images(self, requests: tuple[GenerationRequest, ...]) -> list[VideoOutput]:
        """Run an images call's `n` requests side by side (a batching policy may share their steps).

        All are validated before any is queued; if one fails, is refused (queue full) or the client
        leaves, the others are cancelled and the first error is raised.
        """
        for request in requests:
            self.limits.check(resolve_request(request, self.card), self._estimator)
        tasks: list[asyncio.Task[VideoOutput]] = []
        try:
            for request in requests:
                tasks.append(asyncio.ensure_future(self.generate_image(request)))
                await asyncio.sleep(0)  # submit now, in order, so a full queue refuses the later ones
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    def get(self, job_id: str) -> JobRecord | None:
        live = self._live.get(job_id)
        if live is not None:
            return live.record
        return self._unsaved.get(job_id) or self.store.get(job_id)

    def page(self, after: str | None, limit: int, order: Literal["asc", "desc"]) -> Page:
        """The store's page, with final states it has not accepted yet shown as they are."""
        page = self.store.page(after, limit, order)
        if not self._unsaved:
            return page
        return Page(tuple(self._unsaved.get(r.id, r) for r in page.records), page.has_more)

    async def cancel(self, job_id: str) -> JobRecord | None:
        """Cancel an active job and wait (up to cancel_wait_s) for the step boundary where it stops."""
        live = self._live.get(job_id)
        if live is None:
            record = self.get(job_id)
            if record is not None and not record.finished and self.store.shared:
                return await self._cancel_elsewhere(job_id)
            return record
        self._engine.cancel(job_id)
        try:
            await asyncio.wait_for(live.finished.wait(), self._config.cancel_wait_s)
        except TimeoutError:
            pass  # still mid-step: it becomes cancelled at the boundary; the caller sees in_progress
        return live.record

    async def _cancel_elsewhere(self, job_id: str) -> JobRecord | None:
        """A job another server runs (shared store): flag its row and wait up to cancel_wait_s for its owner."""
        self.store.request_cancel(job_id)
        deadline = self._loop.time() + self._config.cancel_wait_s
        record = self.store.get(job_id)
        while record is not None and not record.finished and self._loop.time() < deadline:
            await asyncio.sleep(CONTROL_POLL_S / 2)
            record = await asyncio.to_thread(self.store.get, job_id)
        return record

    def delete(self, job_id: str) -> bool:
        """Cancel the job if active, then drop its row and files (both or neither: raises OSError/STORE_ERRORS).

        False if there was no such job. A job cancelled here whose row then cannot be removed stays, cancelled.
        """
        live = self._live.get(job_id)
        if live is not None:
            self._engine.cancel(job_id)
            self._finish(live, "cancelled")
        release_session(self._caches, job_id)
        deleted = self.store.delete(job_id)
        self._unsaved.pop(job_id, None)
        return deleted

    def subscribe(self, job_id: str) -> Subscription | None:
        """None for an unknown job. Runs on the loop thread, so no update slips between snapshot and queue."""
        live = self._live.get(job_id)
        if live is None:
            record = self.get(job_id)
            if record is None:
                return None
            # Not live means finished, except in the moment between engine stop and store close.
            return Subscription(JobUpdate(record.status if record.finished else "progress", record), None)
        queue = UpdateQueue(self._config.sse_queue_size)
        live.subscribers.add(queue)
        t = live.tracker
        return Subscription(JobUpdate("progress", live.record, t.phase, t.step, t.total), queue)

    def unsubscribe(self, job_id: str, queue: UpdateQueue) -> None:
        live = self._live.get(job_id)
        if live is not None:
            live.subscribers.discard(queue)

    async def drain(self, grace_s: float) -> None:
        """Shutdown, before connections close: refuse new work, fail queued jobs, give running ones `grace_s`.

        Jobs and image requests still running at the deadline are cancelled; every job ends with a final
        state its event streams receive, so they finish cleanly instead of being cut.
        """
        self._draining = True
        for live in list(self._live.values()):
            if live.record.status == "queued":
                self._engine.cancel(live.record.id)
                self._finish(live, "failed", error=SERVER_RESTART)
        deadline = self._loop.time() + grace_s
        while (self._live or self._images) and self._loop.time() < deadline:
            await asyncio.sleep(0.05)
        for live in list(self._live.values()):
            self._engine.cancel(live.record.id)
            self._finish(live, "failed", error=SERVER_RESTART)
        for request_id in list(self._images):
            self._engine.cancel(request_id)
        if self._live or self._images:
            log.warning("shutdown grace period of %.1fs over: stopped %d job(s)", grace_s,
                        len(self._live) + len(self._images))

    async def close(self) -> None:
        """Stop the engine, let result files being written finish, fail what is left (server_restart)."""
        self._draining = self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._expirer is not None:
            self._expirer.cancel()
        await asyncio.to_thread(self._engine.close)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for live in list(self._live.values()):
            self._finish(live, "failed", error=SERVER_RESTART)
        self._flush_unsaved()
        if self._unsaved:
            log.error("%d job(s) keep a stale state in the store (it refused writes); the next start fails them",
                      len(self._unsaved))
        self.media.close()
        await self.streams.close()
        self.store.close()

    def _submit(self, request: GenerationRequest) -> JobHandle:
        """Resolve, check this server's limits, enqueue (rejections are counted by the error handler)."""
        if self._draining:
            raise EngineClosed("no new work is accepted")
        resolved = resolve_request(request, self.card)
        self.limits.check(resolved, self._estimator)
        return self._engine.submit(resolved, self._bridge)

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
            if not live.finished.is_set():  # the write may have failed the job
                self._publish(live, JobUpdate("progress", live.record))
        elif isinstance(event, ProgressEvent):
            percent = live.tracker.update(event.phase, event.step, event.total)
            if percent != live.record.progress:
                self._write(live, progress=percent)
            if not live.finished.is_set():
                self._publish(live, JobUpdate("progress", live.record, event.phase, event.step, event.total))
        elif isinstance(event, ChunkEvent):
            self._chunk(live, event)
        elif isinstance(event, TextEvent):
            # One event per decoded token; a token that completes no character yet carries no text to stream.
            if event.text and not live.finished.is_set():
                self._publish(live, JobUpdate("reasoning", live.record, event.phase, text=event.text))
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
            reason = redact_paths(str(exc), str(self.store.data_dir.resolve()))
            self._finish(live, "failed", error=("output_error", f"could not write the video: {reason}"))
            release_session(self._caches, job_id)
            return
        await self.streams.seal(job_id)
        if self._live.get(job_id) is not live:  # deleted while encoding
            self.store.remove_files(job_id)
            release_session(self._caches, job_id)
            return
        metadata = dict(output.metadata)
        if live.record.time_to_first_chunk_s is not None:
            metadata["time_to_first_chunk_s"] = live.record.time_to_first_chunk_s
        self._finish(live, "completed", metadata=metadata)

    def _write_files(self, job_id: str, output: VideoOutput) -> None:
        if output.num_frames == 0:  # audio only (text-to-audio models): the waveform, whole, as WAV
            write_wav(AudioTrack(output.audio, output.sample_rate), self.store.audio_path(job_id))
            return
        write_png(output.frames[0], self.store.thumbnail_path(job_id))
        write_video(output.frames, output.fps, self.store.video_path(job_id),  # sound (if any) as AAC beside it
                    audio=track_of(output.audio, output.sample_rate))
        if output.session is not None:  # a causal video: what extend_from continues from
            save_session(self.store, job_id, output.session)
        if output.actions is not None:  # a world model's predicted actions (variant=actions / actions_npy)
            save_actions(self.store.actions_path(job_id), output.actions)

    def _chunk(self, live: _LiveJob, event: ChunkEvent) -> None:
        """A decoded chunk: time to the first one, the job's stream file, a `chunk` update."""
        if live.record.time_to_first_chunk_s is None:
            seconds = round(time.perf_counter() - live.submitted, 3)
            self.metrics.first_chunk(seconds)
            self._write(live, first_chunk_s=seconds)
        if live.finished.is_set():  # the write failed the job
            return
        self.streams.feed(event)
        self._publish(live, JobUpdate("chunk", live.record, chunk=ChunkInfo.of(event)))

    def _write(self, live: _LiveJob, *, status: str | None = None, progress: int | None = None,
               first_chunk_s: float | None = None) -> None:
        """Write a running job's change through; a store that refuses it fails the job rather than strand it."""
        try:
            if status is not None:
                self.store.set_status(live.record.id, status)
                live.record = dataclasses.replace(live.record, status=status)
            if progress is not None:
                self.store.set_progress(live.record.id, progress)
                live.record = dataclasses.replace(live.record, progress=progress)
            if first_chunk_s is not None:
                self.store.set_first_chunk(live.record.id, first_chunk_s)
                live.record = dataclasses.replace(live.record, time_to_first_chunk_s=first_chunk_s)
        except STORE_ERRORS as exc:
            log.error("job store write for %s failed (%s); stopping the job", live.record.id, exc)
            self._engine.cancel(live.record.id)
            self._finish(live, "failed", error=(
                "storage_error", f"the server could not record this job's progress ({exc}); submit it again"))

    def _finish(
        self, live: _LiveJob, status: str, *, metadata: Mapping[str, Any] | None = None,
        error: tuple[str, str] | None = None,
    ) -> None:
        code, message = error if error else (None, None)
        if message is not None:
            message = redact_paths(message, str(self.store.data_dir.resolve()))
        # OpenAI's completed_at is "when the job completed, if finished": a cancelled job never did, so None.
        completed_at = None if status == "cancelled" else _now()
        final = dataclasses.replace(
            live.record, status=status, completed_at=completed_at, metadata=metadata, error_code=code,
            error_message=message, progress=100 if status == "completed" else live.record.progress,
        )
        self._store_final(final)
        log.info("video %s %s on %s%s", final.id, status, self.server_name, f" ({code})" if code else "")
        self._end(live, final)

    def _store_final(self, final: JobRecord) -> None:
        error = (final.error_code, final.error_message) if final.error_code else None
        try:
            self.store.finish(final.id, final.status, final.completed_at, metadata=final.metadata,
                              error=error)  # type: ignore[arg-type]
            self._unsaved.pop(final.id, None)
        except STORE_ERRORS as exc:
            log.error("job store refused the final state of %s (%s); kept in memory, retried later", final.id, exc)
            self._unsaved[final.id] = final

    def _flush_unsaved(self) -> None:
        """Write final states the store refused before; stops at the first refusal (the disk is still full)."""
        for final in list(self._unsaved.values()):
            self._store_final(final)
            if final.id in self._unsaved:
                return

    def _end(self, live: _LiveJob, final: JobRecord) -> None:
        """Forget the live job and tell its subscribers how it ended."""
        live.record = final
        self._live.pop(final.id, None)
        self.streams.abort(final.id)  # a completed job's stream was sealed before: nothing left to end
        self.metrics.finished("video", final.status, time.perf_counter() - live.submitted)
        self._publish(live, JobUpdate(final.status, final))
        live.finished.set()

    def _publish(self, live: _LiveJob, update: JobUpdate) -> None:
        for queue in live.subscribers:
            queue.put_nowait(update)  # a slow reader's full queue drops a progress tick, else a chunk notice


def request_params(request: GenerationRequest) -> dict[str, Any]:
    """The resolved request as stored with the job: with the job's prompt, enough to run it again, seed included.

    The prompt is left out: the job stores it once, as its `prompt`, not a second time here.
    """
    media = ("image", "last_image", "video", "extend_from", "init_audio")  # not stored; noted as given
    params = {f.name: getattr(request, f.name) for f in dataclasses.fields(request) if f.name not in media}
    params.pop("request_id")
    params.pop("image", None)  # input images are not stored with a job (video jobs take none)
    params.pop("prompt")
    params["task"] = request.task.value
    params.update({name: True for name in media if getattr(request, name) is not None})
    if isinstance(request.extend_from, VideoSession):
        params["extend_from"] = request.extend_from.session_id  # the source video's id
    if request.action is not None:  # the family's resolved block says how it is stored (no media)
        params["action"] = request.action.params()
    # Camera blocks (SANA-WM) as JSON: the action string (the validated block keeps it) and plain lists.
    params["camera"] = getattr(request.camera, "action", request.camera)
    for name in ("c2w", "intrinsics"):
        if params[name] is not None:
            params[name] = np.asarray(params[name], dtype=float).tolist()
    return params


def _now() -> int:
    return int(time.time())
