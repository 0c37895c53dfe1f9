"""The fleet's HTTP ingress: the OpenAI routes of `vidloom serve`, over the shared job store and model replicas.

Creates go to a replica of the requested model (Ray Serve picks the least loaded). Everything else
reads or writes the shared store, so it works wherever the job runs: retrieve, list and download
read rows and files; cancel and delete flag the row, which the owning replica polls; event streams
follow the row. /metrics joins the metrics every live replica publishes in the store.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any, Literal, Mapping

from fastapi import FastAPI, Request, Response
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from vidloom.serving.config import ServeConfig
from vidloom.serving.errors import APIError, echo, install_error_handlers
from vidloom.serving.guard import HostGuard, RequestGuard
from vidloom.serving.job_store import JobRecord, JobStore, Page
from vidloom.serving.jobs import JobUpdate, Subscription
from vidloom.serving.protocol import ModelList, ModelObject, VideoCreateBody, VideoObject
from vidloom.serving.request_body import BodyLimit, read_body
from vidloom.serving.video_routes import router as video_router

POLL_S = 0.25  # how often an event stream looks at its job's row

# Ray Serve runs a pickled copy of the ingress app, which the deployment's constructor cannot reach;
# the constructor leaves its FleetJobs here (one ingress per process) and each request picks it up.
_ATTACHED: dict[str, "FleetJobs"] = {}


def attach_jobs(jobs: "FleetJobs") -> None:
    _ATTACHED["jobs"] = jobs


def attached_jobs() -> "FleetJobs | None":
    # A module function, so the pickled app calls into this module's state rather than a pickled copy of it.
    return _ATTACHED.get("jobs")


class IngressMetrics:
    """Requests the ingress refused itself (by error code), for the joined /metrics."""

    def __init__(self) -> None:
        self.rejections: dict[str, int] = {}

    def rejected(self, code: str) -> None:
        self.rejections[code] = self.rejections.get(code, 0) + 1

    def lines(self) -> list[str]:
        out = ["# HELP vidloom_fleet_rejected_total Requests the ingress refused, by error code.",
               "# TYPE vidloom_fleet_rejected_total counter"]
        return out + [f'vidloom_fleet_rejected_total{{code="{c}"}} {n}' for c, n in sorted(self.rejections.items())]


class FleetJobs:
    """The part of JobManager's interface the shared video routes use, served from the store."""

    def __init__(self, store: JobStore, config: ServeConfig, replicas: Mapping[str, Any]) -> None:
        self.store = store
        self._config = config
        self.replicas = dict(replicas)  # model id -> Ray Serve handle of its replicas
        self._polls: dict[int, asyncio.Task[None]] = {}
        self.metrics = IngressMetrics()  # what errors.count_rejection counts into

    def get(self, job_id: str) -> JobRecord | None:
        return self.store.get(job_id)

    def page(self, after: str | None, limit: int, order: Literal["asc", "desc"]) -> Page:
        return self.store.page(after, limit, order)

    async def cancel(self, job_id: str) -> JobRecord | None:
        """Flag the row; the owning replica cancels at its next poll and step boundary. Waits up to cancel_wait_s."""
        self.store.request_cancel(job_id)
        deadline = time.monotonic() + self._config.cancel_wait_s
        record = self.store.get(job_id)
        while record is not None and not record.finished and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S / 2)
            record = await asyncio.to_thread(self.store.get, job_id)
        return record

    def delete(self, job_id: str) -> bool:
        """Row and files go now; the owning replica sees the row gone, stops the job and drops late files."""
        self.store.request_cancel(job_id)
        return self.store.delete(job_id)

    def subscribe(self, job_id: str) -> Subscription | None:
        record = self.store.get(job_id)
        if record is None:
            return None
        if record.finished:
            return Subscription(JobUpdate(record.status, record), None)
        queue: asyncio.Queue[JobUpdate] = asyncio.Queue(self._config.sse_queue_size)
        self._polls[id(queue)] = asyncio.get_running_loop().create_task(self._follow(record, queue))
        return Subscription(JobUpdate("progress", record), queue)

    def unsubscribe(self, job_id: str, queue: asyncio.Queue[JobUpdate]) -> None:
        task = self._polls.pop(id(queue), None)
        if task is not None:
            task.cancel()

    async def _follow(self, last: JobRecord, queue: asyncio.Queue[JobUpdate]) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            record = await asyncio.to_thread(self.store.get, last.id)
            if record is None:  # deleted: the stream ends as the job did
                record = JobRecord(**{**last.__dict__, "status": "cancelled", "completed_at": int(time.time())})
            if (record.status, record.progress) == (last.status, last.progress):
                continue
            last = record
            if queue.full():
                queue.get_nowait()  # a slow reader loses a progress tick, never the final event (it is last)
            queue.put_nowait(JobUpdate(record.status if record.finished else "progress", record))
            if record.finished:
                return

    def exposition(self) -> bytes:
        merged = merge_metrics(self.store.live_servers(), self.replicas)
        return merged + ("\n".join(self.metrics.lines()) + "\n").encode()


def merge_metrics(servers: list[tuple[str, str, str]], models: Mapping[str, Any]) -> bytes:
    """Every live replica's exposition with a `replica` label added, plus replicas per model."""
    out = ["# HELP vidloom_fleet_replicas Live replicas per model.", "# TYPE vidloom_fleet_replicas gauge"]
    for model in models:
        out.append(f'vidloom_fleet_replicas{{model="{model}"}} {sum(1 for s in servers if s[1] == model)}')
    seen: set[str] = set()
    for name, _, text in servers:
        for line in text.splitlines():
            if line.startswith("#"):
                if line not in seen:
                    seen.add(line)
                    out.append(line)
                continue
            match = re.match(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+.*)$", line)
            if match:
                labels = ",".join(filter(None, [match.group(2), f'replica="{name}"']))
                out.append(f"{match.group(1)}{{{labels}}} {match.group(3)}")
    return ("\n".join(out) + "\n").encode()


def create_fleet_app(config: ServeConfig) -> FastAPI:
    """The ingress app; `app.state.jobs` (a FleetJobs) is set by the Ray deployment that serves it."""
    app = FastAPI(title="vidloom fleet", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.config = config
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, timeout_s=config.body_timeout_s)
    app.add_middleware(RequestGuard, config=config)
    app.add_middleware(HostGuard, config=config)
    @app.middleware("http")
    async def attach(request: Request, call_next: Any) -> Any:
        if not hasattr(request.app.state, "jobs") and (jobs := attached_jobs()) is not None:
            request.app.state.jobs = jobs
        return await call_next(request)

    _add_fleet_routes(app)
    app.include_router(video_router)  # after our POST /v1/videos, which routes to a replica
    return app


def _add_fleet_routes(app: FastAPI) -> None:
    @app.post("/v1/videos")
    async def create_video(request: Request) -> VideoObject:
        jobs: FleetJobs = request.app.state.jobs
        body = await read_body(request, VideoCreateBody)
        model = body.model or next(iter(jobs.replicas))
        if model not in jobs.replicas:
            raise APIError(404, f"model {echo(model)} is not served by this fleet; it serves "
                           f"{', '.join(jobs.replicas)}", param="model", code="model_not_found")
        fields = body.model_dump()
        fields["input_reference"] = None if body.input_reference is None else "upload"  # files stay here
        answer = await jobs.replicas[model].submit.remote(fields)
        if "error" in answer:
            raise APIError(**answer["error"])
        return VideoObject.from_record(answer["record"])

    @app.get("/health")
    async def health(request: Request) -> dict[str, object]:
        jobs: FleetJobs = request.app.state.jobs
        servers = await asyncio.to_thread(jobs.store.live_servers)
        return {"status": "ok", "models": {m: sum(1 for s in servers if s[1] == m) for m in jobs.replicas}}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        jobs: FleetJobs = request.app.state.jobs
        return Response(await asyncio.to_thread(jobs.exposition), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models(request: Request) -> ModelList:
        jobs: FleetJobs = request.app.state.jobs
        return ModelList(data=[ModelObject(id=m, created=request.app.state.started_at) for m in jobs.replicas])
