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
import dataclasses
import logging
import os
import socket
import time
from typing import Any, Literal, Mapping

from vidloom.core.output import (
    CancelledEvent, ChunkEvent, CompletedEvent, Event, FailedEvent, ProgressEvent, StartedEvent, TextEvent,
    VideoOutput,
)
from vidloom.core.request import GenerationRequest
from vidloom.media.request_inputs import resolve_request
from vidloom.media.audio import AudioTrack, track_of, write_wav
from vidloom.media.video import write_png, write_video
from vidloom.runtime.async_engine import AsyncEngine, EngineClosed, JobHandle
from vidloom.runtime.cache_manager import CacheManager
from vidloom.runtime.engine import EngineDriver
from vidloom.serving.action_results import save_actions
from vidloom.serving.chunk_stream import ChunkInfo, StreamFiles
from vidloom.serving.config import ServeConfig
from vidloom.serving.errors import redact_paths
from vidloom.serving.image_jobs import ImageRequests
from vidloom.serving.job_control import CONTROL_POLL_S, SharedStoreControl  # noqa: F401  (re-exported)
from vidloom.serving.job_recovery import (  # noqa: F401  (re-exported: callers import them from here)
    SERVER_RESTART, now, open_store, recover_lost_jobs, request_params,
)
from vidloom.serving.job_store import STORE_ERRORS, JobRecord, JobStore, Page
from vidloom.serving.job_updates import JobUpdate, LiveJob, Subscription  # noqa: F401  (re-exported)
from vidloom.serving.kv_metrics import register_kv_metrics
from vidloom.serving.media_pool import MediaPool
from vidloom.serving.metrics import ServerMetrics
from vidloom.serving.params import PlannedVideo
from vidloom.serving.progress import ProgressTracker, expected_units
from vidloom.serving.update_queue import UpdateQueue
from vidloom.serving.video_sessions import expire_sessions, release_session, save_session

log = logging.getLogger(__name__)


class JobManager(ImageRequests, SharedStoreControl):
    """Owns the AsyncEngine, the job store and the metrics of one server (images: image_jobs.py; other servers:
    job_control.py; persistence across restarts: job_recovery.py)."""

    def __init__(
        self, engine: EngineDriver, config: ServeConfig, loop: asyncio.AbstractEventLoop, store: JobStore | None = None,
    ) -> None:
        card = engine.card  # the name the API shows (model fields, /v1/models) may be --served-model-name
        self.card = dataclasses.replace(card, model_id=config.served_model_name) if config.served_model_name else card
        self._config = config
        self._loop = loop
        self.store = store if store is not None else open_store(config)
        self._engine = AsyncEngine(engine, policy=config.policy, slots=config.slots, queue_size=config.queue_size,
                                   max_batch=config.max_batch, batch_wait_s=config.batch_wait_s,
                                   decode_slots=config.decode_slots)
        # The device's memory budget (one request alone, and the sum over resident ones) is the runtime's
        # (Engine.admission); here only an explicit max_request_memory_bytes, a server limit like max_pixels.
        self._estimator = engine.estimator
        self.limits = config.request_limits(self.card, None)
        self.metrics = ServerMetrics(lambda: self._engine.queue_depth, lambda: self._engine.in_flight,
                                     lambda: self._engine.compile_misses)
        self._caches: CacheManager | None = engine.caches  # KV slabs and resident sessions
        if self._caches is not None:
            register_kv_metrics(self.metrics.registry, self._caches)
        self._live: dict[str, LiveJob] = {}
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

    def submit_video(self, planned: PlannedVideo, key_owner: str | None = None) -> JobRecord:
        """Validate, enqueue and store a job of `key_owner` (the caller's key's owner; None: a server without
        keys). Raises InvalidRequest or EngineBusy before storing anything."""
        self._flush_unsaved()
        resolved = self._submit(planned.request).request
        record = JobRecord(
            id=resolved.request_id, model=self.card.model_id, status="queued", progress=0, created_at=now(),
            completed_at=None, size=planned.size, seconds=planned.seconds, prompt=resolved.prompt,
            params=request_params(resolved), key_owner=key_owner,
        )
        try:
            self.store.add(record)
        except BaseException as exc:
            self._engine.cancel(record.id)  # never run a job nobody can see
            if isinstance(exc, STORE_ERRORS):
                self.metrics.rejected("storage_error")
            raise
        tracker = ProgressTracker(expected_units(resolved, self.card))
        self._live[record.id] = LiveJob(record, tracker, time.perf_counter())
        self.streams.open(record.id)
        return record

    def get(self, job_id: str) -> JobRecord | None:
        live = self._live.get(job_id)
        if live is not None:
            return live.record
        return self._unsaved.get(job_id) or self.store.get(job_id)

    def page(self, after: str | None, limit: int, order: Literal["asc", "desc"],
             only_owner: str | None = None) -> Page:
        """This model's page of the store (servers of other models may share it; every key owner's jobs, or only
        `only_owner`'s), with final states it has not accepted yet shown as they are."""
        page = self.store.page(after, limit, order, only_owner, model=self.card.model_id)
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
        state = JobUpdate("progress", live.record, t.phase, t.step, t.total)
        if not live.reasoning:
            return Subscription(state, queue)
        # The reasoning written before this reader came, in one update, then the current state.
        queue.put_nowait(state)
        return Subscription(JobUpdate("reasoning", live.record, live.reasoning_phase, text="".join(live.reasoning)),
                            queue)

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
        """Resolve (once: the engine takes it as resolved), check this server's limits, enqueue (rejections are
        counted by the error handler)."""
        if self._draining:
            raise EngineClosed("no new work is accepted")
        resolved = resolve_request(request, self.card)
        self.limits.check(resolved, self._estimator)
        return self._engine.submit(resolved, self._bridge, resolved=True)

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
                live.reasoning.append(event.text)
                live.reasoning_phase = event.phase
                self._publish(live, JobUpdate("reasoning", live.record, event.phase, text=event.text))
        elif isinstance(event, CompletedEvent):
            task = self._loop.create_task(self._save(live, event.output))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif isinstance(event, FailedEvent):
            self._finish(live, "failed", error=(event.code, event.message))
        elif isinstance(event, CancelledEvent):
            self._finish(live, "cancelled")

    async def _save(self, live: LiveJob, output: VideoOutput) -> None:
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

    def _chunk(self, live: LiveJob, event: ChunkEvent) -> None:
        """A decoded chunk: time to the first one, the job's stream file, a `chunk` update."""
        if live.record.time_to_first_chunk_s is None:
            seconds = round(time.perf_counter() - live.submitted, 3)
            self.metrics.first_chunk(seconds)
            self._write(live, first_chunk_s=seconds)
        if live.finished.is_set():  # the write failed the job
            return
        self.streams.feed(event)
        self._publish(live, JobUpdate("chunk", live.record, chunk=ChunkInfo.of(event)))

    def _write(self, live: LiveJob, *, status: str | None = None, progress: int | None = None,
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
        self, live: LiveJob, status: str, *, metadata: Mapping[str, Any] | None = None,
        error: tuple[str, str] | None = None,
    ) -> None:
        code, message = error if error else (None, None)
        if message is not None:
            message = redact_paths(message, str(self.store.data_dir.resolve()))
        # OpenAI's completed_at is "when the job completed, if finished": a cancelled job never did, so None.
        completed_at = None if status == "cancelled" else now()
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

    def _end(self, live: LiveJob, final: JobRecord) -> None:
        """Forget the live job and tell its subscribers how it ended."""
        live.record = final
        self._live.pop(final.id, None)
        self.streams.abort(final.id)  # a completed job's stream was sealed before: nothing left to end
        self.metrics.finished("video", final.status, time.perf_counter() - live.submitted)
        self._publish(live, JobUpdate(final.status, final))
        live.finished.set()

    def _publish(self, live: LiveJob, update: JobUpdate) -> None:
        for queue in live.subscribers:
            queue.put_nowait(update)  # a slow reader's full queue drops a progress tick, else a chunk notice
