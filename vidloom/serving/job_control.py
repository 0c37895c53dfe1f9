"""Cross-server control on a shared job store: cancels and deletes sent through another server, recovery of
dead servers' jobs, and re-queued jobs adopted here. A part of JobManager (a mixin over its state)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from vidloom.core.request import GenerationRequest, Task
from vidloom.core.session import VideoSession
from vidloom.serving.job_recovery import now, recover_lost_jobs
from vidloom.serving.job_store import STORE_ERRORS, JobRecord
from vidloom.serving.job_updates import LiveJob
from vidloom.serving.progress import ProgressTracker, expected_units

if TYPE_CHECKING:
    from vidloom.serving.jobs import JobManager

log = logging.getLogger("vidloom.serving.jobs")

CONTROL_POLL_S = 0.25  # how soon a cancel or delete sent to another server reaches the job's own server


class SharedStoreControl:
    """JobManager's side that talks to other servers through the store (shared stores only)."""

    async def _sweep(self: JobManager) -> None:
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
                                            self.metrics.exposition().decode(), now())
            except STORE_ERRORS as exc:
                log.error("job store control poll failed (%s); retrying", exc)

    async def _apply_control(self: JobManager) -> None:
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

    def adopt_requeued(self: JobManager) -> int:
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
                live = LiveJob(record, ProgressTracker(1), time.perf_counter())
                self._finish(live, "failed", error=("requeue_failed", f"could not run this job again: {exc}"))
                continue
            tracker = ProgressTracker(expected_units(resolved, self.card))
            self._live[record.id] = LiveJob(record, tracker, time.perf_counter())
            self.streams.open(record.id)
            adopted += 1
        if adopted:
            log.info("running %d re-queued job(s) of a server that stopped", adopted)
        return adopted

    async def _cancel_elsewhere(self: JobManager, job_id: str) -> JobRecord | None:
        """A job another server runs (shared store): flag its row and wait up to cancel_wait_s for its owner."""
        self.store.request_cancel(job_id)
        deadline = self._loop.time() + self._config.cancel_wait_s
        record = self.store.get(job_id)
        while record is not None and not record.finished and self._loop.time() < deadline:
            await asyncio.sleep(CONTROL_POLL_S / 2)
            record = await asyncio.to_thread(self.store.get, job_id)
        return record
