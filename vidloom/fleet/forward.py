"""One HTTP request carried from the fleet's ingress to a model replica, and its response carried back.

The ingress has already applied the single server's guards and limits (Host, API key, origin, content
type, body size and time) and read the body; the replica runs the request through the single server's
own routes (`replica_app`), so a create, an image or a chat answers exactly as `vidloom serve` would:
the same validation, the same errors, uploads included. The response comes back as a stream of
messages (start, then body chunks), so a chat's SSE tokens flow as they are made; cancelling the
stream (the client left) shows the route an `http.disconnect`, as uvicorn would.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vidloom.serving.api_keys import CALLER_SCOPE_KEY, OPEN, caller_of
from vidloom.serving.chat_routes import ChatState
from vidloom.serving.chat_routes import router as chat_router
from vidloom.serving.capabilities import ModelDetails, capabilities
from vidloom.serving.config import ServeConfig
from vidloom.serving.errors import install_error_handlers
from vidloom.serving.image_routes import router as image_router
from vidloom.serving.jobs import JobManager
from vidloom.serving.option_bodies import serve_options
from vidloom.serving.protocol import VideoCreateBody
from vidloom.serving.video_routes import router as video_router

log = logging.getLogger(__name__)
# method, path, query_string, headers, body, client, server, scheme, caller (api_keys.Caller) (picklable)
Forwarded = dict[str, Any]


async def forwarded_request(request: Request) -> Forwarded:
    """What a replica needs to run `request` (its body is read here, within the ingress's BodyLimit)."""
    scope = request.scope
    # The ingress checked the credentials; they do not travel on into the cluster (or its logs).
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"authorization", b"cookie")]
    return {"method": scope["method"], "path": scope["path"], "query_string": scope.get("query_string", b""),
            "headers": headers, "body": await request.body(), "client": scope.get("client"),
            "server": scope.get("server"), "scheme": scope.get("scheme", "http"),
            "caller": caller_of(scope)}  # whose job a create makes, whose jobs a replica may show


def replica_app(manager: JobManager, config: ServeConfig) -> FastAPI:
    """The single server's model routes over a replica's JobManager; no guards (the ingress applied them)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.config = config
    app.state.jobs = manager
    app.state.chat = ChatState(manager, config)
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    app.include_router(video_router)
    app.include_router(image_router)
    app.include_router(chat_router)
    app.add_api_route("/v1/models/{model_id:path}", replica_model, methods=["GET"])
    serve_options(app, manager.card, {"/v1/videos": VideoCreateBody})  # the bodies read the replica's options
    return app


async def replica_model(request: Request, model_id: str) -> ModelDetails:
    """GET /v1/models/{id} with the `capabilities` extension (the playground builds its form from it): the
    ingress has already resolved `model_id` to this replica's model, which it may name by a path or hub id
    rather than the card's id, so the answer keeps the fleet's name."""
    manager: JobManager = request.app.state.jobs
    return ModelDetails(id=model_id, created=request.app.state.started_at,
                        capabilities=capabilities(manager.card, getattr(manager, "limits", None),
                                                  manager.engine.program))


async def run_forwarded(app: ASGIApp, request: Forwarded, loop: asyncio.AbstractEventLoop) -> AsyncIterator[Message]:
    """Run `app` for `request` on `loop` (the replica's job loop); yields its response messages on the caller's loop.

    Closing this generator early (the ingress cancelled: its client left) makes the route's next
    `receive()` return `http.disconnect`, which cancels a render waiting on it.
    """
    here = asyncio.get_running_loop()
    out: asyncio.Queue[Message | None] = asyncio.Queue()
    gone = asyncio.Event()  # set on `loop`, where the route waits on it

    def put(message: Message | None) -> None:
        here.call_soon_threadsafe(out.put_nowait, message)

    future = asyncio.run_coroutine_threadsafe(_run(app, request, put, gone), loop)
    try:
        while (message := await out.get()) is not None:
            yield message
    finally:
        if not future.done():
            loop.call_soon_threadsafe(gone.set)


async def _run(app: ASGIApp, request: Forwarded, put: Any, gone: asyncio.Event) -> None:
    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": request["method"], "scheme": request["scheme"], "path": request["path"],
        "raw_path": request["path"].encode(), "root_path": "", "query_string": request["query_string"],
        "headers": [(bytes(k), bytes(v)) for k, v in request["headers"]],
        "client": request["client"], "server": request["server"], "state": {},
        CALLER_SCOPE_KEY: request.get("caller", OPEN),
    }
    body_sent = False
    started = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request["body"], "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal started
        if message["type"] == "http.response.start":
            started = True
            put({"status": message["status"], "headers": [(bytes(k), bytes(v)) for k, v in message["headers"]]})
        elif message["type"] == "http.response.body" and (message.get("body") or not message.get("more_body")):
            put({"body": bytes(message.get("body", b""))})

    try:
        await app(scope, receive, send)
    except Exception:  # the error handlers answered 500 already if the response had not started
        log.exception("a forwarded %s %s failed", request["method"], request["path"])
        if not started:
            put({"status": 500, "headers": [(b"content-type", b"application/json")]})
            put({"body": b'{"error":{"message":"internal server error","type":"server_error","param":null,'
                         b'"code":"internal_error"}}'})
    finally:
        put(None)


class ForwardedResponse(Response):
    """The ingress's answer: a replica's response messages (`start`, then the rest of `stream`) sent as they come.

    When the client disconnects, the replica stream is cancelled, which reaches the route as a disconnect.
    """

    def __init__(self, start: Message, stream: Any) -> None:  # no super().__init__: there is no body to render
        self.start, self.stream = start, stream
        self.status_code = start["status"]
        self.raw_headers = start["headers"]
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.start["status"], "headers": self.start["headers"]})
        relay = asyncio.ensure_future(self._relay(send))
        watcher = asyncio.ensure_future(_client_gone(receive))
        try:
            await asyncio.wait({relay, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if relay.done():
                relay.result()  # a failed relay raises here
        finally:
            finished = relay.done() and not relay.cancelled() and relay.exception() is None
            for task in (relay, watcher):
                task.cancel()
            if not finished:  # the client left (or the relay failed): stop the work on the replica
                self.stream.cancel()

    async def _relay(self, send: Send) -> None:
        async for message in self.stream:
            await send({"type": "http.response.body", "body": message["body"], "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
