"""The fleet's HTTP ingress: the OpenAI routes of `vidloom serve`, over the shared job store and model replicas.

The ingress is served by our own uvicorn (fleet/server.py), with the single server's protocol,
guards and limits. Requests that need a model (video creates, images, chat) are forwarded whole
to a replica of the requested model (the router picks the least loaded), which runs them through
the single server's routes (fleet/forward.py). Everything else reads or writes the shared store, so
it works wherever the job runs: retrieve, list and download read rows and files; cancel and delete
flag the row, which the owning replica polls; event streams follow the row. /metrics joins the
metrics every live replica publishes in the store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any, Literal, Mapping

from fastapi import FastAPI, Request, Response
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from vidloom.fleet.forward import ForwardedResponse, forwarded_request

from vidloom.serving.config import ServeConfig
from vidloom.serving.disconnect import unless_disconnected
from vidloom.serving.errors import APIError, echo, install_error_handlers
from vidloom.serving.guard import install_guards
from vidloom.serving.job_store import JobRecord, JobStore, Page
from vidloom.serving.jobs import JobUpdate, Subscription
from vidloom.serving.image_routes import router as image_router
from vidloom.serving.protocol import ModelList, ModelObject
from vidloom.serving.ui_routes import ui_router
from vidloom.serving.video_routes import router as video_router

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often an event stream looks at its job's row
MODEL_ROUTES = ("/v1/videos", "/v1/images/generations", "/v1/images/edits", "/v1/chat/completions")


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

    def page(self, after: str | None, limit: int, order: Literal["asc", "desc"],
             only_owner: str | None = None) -> Page:
        return self.store.page(after, limit, order, only_owner)

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
                record = JobRecord(**{**last.__dict__, "status": "cancelled", "completed_at": None})
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


def create_fleet_app(config: ServeConfig, jobs: FleetJobs) -> FastAPI:
    """The ingress app over `jobs` (the shared store and a handle per model's replicas)."""
    app = FastAPI(title="vidloom fleet", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.config = config
    app.state.jobs = jobs
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    install_guards(app, config)  # Host, CORS, key/origin/type, body size
    _add_fleet_routes(app)
    # After the forwarding routes above: the shared routers' GETs and DELETEs read the store.
    app.include_router(video_router)
    app.include_router(image_router)
    if config.ui_enabled:  # the web playground, as on `vidloom serve` (a client of the API above)
        app.include_router(ui_router())
    return app


def _add_fleet_routes(app: FastAPI) -> None:
    for path in MODEL_ROUTES:
        app.add_api_route(path, forward, methods=["POST"])

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

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(request: Request, model_id: str) -> Response:
        """The model object with its `capabilities` (extension), which only a replica's card can tell."""
        jobs: FleetJobs = request.app.state.jobs
        if model_id not in jobs.replicas:
            raise _unknown_model(model_id, jobs)
        return await _run_on_replica(request, model_id, await forwarded_request(request))


async def forward(request: Request) -> Response:
    """A model request, run by a replica of its `model` (the first model when none is named)."""
    jobs: FleetJobs = request.app.state.jobs
    payload = await forwarded_request(request)
    model = await requested_model(request, payload["body"]) or next(iter(jobs.replicas))
    if model not in jobs.replicas:
        raise _unknown_model(model, jobs)
    return await _run_on_replica(request, model, payload)


async def _run_on_replica(request: Request, model: str, payload: dict[str, Any]) -> Response:
    jobs: FleetJobs = request.app.state.jobs
    stream = jobs.replicas[model].options(stream=True).http.remote(payload)
    try:
        start = await unless_disconnected(request, _first(stream))
    except BaseException:
        stream.cancel()
        raise
    return ForwardedResponse(start, stream)  # type: ignore[return-value]


async def _first(stream: Any) -> dict[str, Any]:
    try:
        return await stream.__anext__()
    except APIError:
        raise
    except Exception as exc:  # the replica died or was stopped mid-call; the client may retry
        log.warning("a replica call failed: %s", exc)
        raise APIError(503, "the model replica is unavailable; retry", code="replica_unavailable",
                       headers={"Retry-After": "1"}) from None


async def requested_model(request: Request, body: bytes) -> str | None:
    """The body's `model` field (JSON or a form's text field); None when absent or unreadable (the replica
    then answers the body's own error, as the single server would)."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media == "multipart/form-data":
        try:
            form = await request.form()
        except Exception:
            return None
        value = form.get("model")
        await form.close()
        return value if isinstance(value, str) and value else None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    value = parsed.get("model") if isinstance(parsed, dict) else None
    return value if isinstance(value, str) and value else None


def _unknown_model(model: str, jobs: FleetJobs) -> APIError:
    return APIError(404, f"model {echo(model)} is not served by this fleet; it serves {', '.join(jobs.replicas)}",
                    param="model", code="model_not_found")
