"""ModelReplica: one vidloom engine and its JobManager, as a Ray Serve deployment's replica.

The JobManager runs on its own event loop in a thread of the replica process, as in `vidloom serve`;
Ray Serve's handle calls hand their work to that loop. Jobs are rows of the fleet's shared store,
owned by this replica while they run: the ingress reads them there, and cancels or deletes them by
writing the store, which this replica's JobManager polls.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Coroutine, TypeVar

from vidloom.serving.config import ServeConfig

log = logging.getLogger(__name__)
T = TypeVar("T")


class ModelReplica:
    """Loads the model, opens the shared store (recovering dead replicas' jobs) and runs jobs."""

    def __init__(self, config: ServeConfig, replica_name: str | None = None) -> None:
        from vidloom.generator import VideoGenerator
        from vidloom.serving.jobs import JobManager, open_store

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        self._config = config
        store = open_store(config)
        self._generator = VideoGenerator.from_pretrained(
            config.model, device=config.device, dtype=config.dtype, deploy=config.deploy)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vidloom-jobs", daemon=True)
        self._thread.start()
        name = replica_name or _serve_replica_name()

        async def start() -> JobManager:
            manager = JobManager(self._generator.engine, config, asyncio.get_running_loop(), store)
            if name:
                manager.server_name = name
            manager.start()
            return manager

        self._jobs = self._call(start())
        self._stopped = False
        log.info("replica %s serving %s (owner %d)", self._jobs.server_name, config.model, store.owner)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return await asyncio.wrap_future(future)

    async def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        """Plan and queue a video job; returns {"record": ...} or {"error": {status, message, param, code, headers}}."""
        return await self._on_loop(self._submit(body))

    async def _submit(self, body: dict[str, Any]) -> dict[str, Any]:
        from vidloom.serving.errors import APIError, engine_errors
        from vidloom.serving.params import plan_video
        from vidloom.serving.protocol import VideoCreateBody

        try:
            parsed = VideoCreateBody.model_validate(body)
            with engine_errors():
                planned = plan_video(parsed, self._jobs.card, self._jobs.limits.max_frames)
                record = self._jobs.submit_video(planned)
        except APIError as exc:
            return {"error": {"status": exc.status, "message": exc.message, "param": exc.param, "code": exc.code,
                              "headers": exc.headers}}
        return {"record": record}

    async def status(self) -> dict[str, Any]:
        """What the ingress's /health and /v1/models report for this replica."""
        return {"model": self._jobs.card.model_id, "replica": self._jobs.server_name,
                "queue_depth": self._jobs.queue_depth, "in_flight": self._jobs.in_flight}

    def record_routing_stats(self) -> dict[str, Any]:
        """Load for LeastJobsRouter: jobs waiting or running on this replica's engine."""
        return {"jobs": self._jobs.queue_depth + self._jobs.in_flight, "at": time.time()}

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose job loop died is restarted (its jobs are then recovered)."""
        if self._stopped or not self._thread.is_alive():
            raise RuntimeError("the replica's job loop is not running")

    def __del__(self) -> None:
        """Ray Serve's graceful stop: drain (running jobs get graceful_shutdown_s), then close."""
        if getattr(self, "_stopped", True):
            return
        self._stopped = True
        try:
            self._call(self._jobs.drain(self._config.graceful_shutdown_s))
            self._call(self._jobs.close())
        except Exception:
            log.exception("stopping the replica failed")
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._generator.close()


def _serve_replica_name() -> str | None:
    """Ray Serve's id of this replica ("deployment#abc123"), for logs and metrics; None outside Serve."""
    try:
        from ray import serve

        context = serve.get_replica_context()
    except Exception:
        return None
    replica_id = getattr(context, "replica_id", None)
    unique = getattr(replica_id, "unique_id", None) or getattr(context, "replica_tag", None)
    return f"{context.deployment}#{unique}" if unique else None
