"""ModelReplica: one vidloom engine and its JobManager, as a Ray Serve deployment's replica.

The JobManager runs on its own event loop in a thread of the replica process, as in `vidloom serve`;
the ingress forwards each model request (video create, images, chat) to `http`, which runs it
through the single server's routes on that loop (fleet/forward.py). Jobs are rows of the fleet's
shared store, owned by this replica while they run: the ingress reads them there, and cancels or
deletes them by writing the store, which this replica's JobManager polls.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, AsyncIterator, Coroutine, TypeVar

from vidloom.fleet.forward import Forwarded, replica_app, run_forwarded
from vidloom.runtime.engine import Engine
from vidloom.serving.config import ServeConfig
from vidloom.serving.job_store import JobStore

log = logging.getLogger(__name__)
T = TypeVar("T")


class ReplicaCore:
    """A JobManager on its own loop thread, and the single server's model routes over it.

    Ray-free, so the ingress can be tested with in-process replicas (tests/helpers/fleet.py).
    """

    def __init__(self, engine: Engine, config: ServeConfig, store: JobStore, name: str | None = None) -> None:
        from vidloom.serving.jobs import JobManager

        self._config = config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vidloom-jobs", daemon=True)
        self._thread.start()

        async def start() -> JobManager:
            manager = JobManager(engine, config, asyncio.get_running_loop(), store)
            if name:
                manager.server_name = name
            manager.start()
            return manager

        self.jobs = self._call(start())
        self.app = replica_app(self.jobs, config)
        self.closed = False

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def http(self, request: Forwarded) -> AsyncIterator[dict[str, Any]]:
        """A forwarded request's response messages (see forward.run_forwarded)."""
        return run_forwarded(self.app, request, self._loop)

    def routing_stats(self) -> dict[str, Any]:
        """Load for LeastJobsRouter: jobs waiting or running on this replica's engine."""
        return {"jobs": self.jobs.queue_depth + self.jobs.in_flight, "at": time.time()}

    def alive(self) -> bool:
        return not self.closed and self._thread.is_alive()

    def close(self) -> None:
        """Drain (running jobs get graceful_shutdown_s), close the manager, stop the loop."""
        if self.closed:
            return
        self.closed = True
        try:
            self._call(self.jobs.drain(self._config.graceful_shutdown_s))
            self._call(self.jobs.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


class ModelReplica:
    """The Ray Serve deployment: loads the model, opens the shared store (recovering dead replicas' jobs)."""

    def __init__(self, config: ServeConfig, replica_name: str | None = None) -> None:
        from vidloom.generator import VideoGenerator
        from vidloom.serving.jobs import open_store

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        store = open_store(config)
        self._generator = VideoGenerator.from_pretrained(
            config.model, device=config.device, dtype=config.dtype, deploy=config.deploy)
        self._core = ReplicaCore(self._generator.engine, config, store, replica_name or _serve_replica_name())
        log.info("replica %s serving %s (owner %d)", self._core.jobs.server_name, config.model, store.owner)

    async def http(self, request: Forwarded) -> AsyncIterator[dict[str, Any]]:
        """Called with a streaming handle: `handle.options(stream=True).http.remote(request)`."""
        async for message in self._core.http(request):
            yield message

    def record_routing_stats(self) -> dict[str, Any]:
        return self._core.routing_stats()

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose job loop died is restarted (its jobs are then recovered)."""
        if not self._core.alive():
            raise RuntimeError("the replica's job loop is not running")

    def __del__(self) -> None:
        """Ray Serve's graceful stop: drain, then close."""
        core = getattr(self, "_core", None)
        if core is None or core.closed:
            return
        try:
            core.close()
        except Exception:
            log.exception("stopping the replica failed")
        finally:
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
