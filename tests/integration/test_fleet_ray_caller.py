"""A forwarded request crosses Ray as Serve sends it to a replica (serialized into another process) and the
replica's routes still see the ingress's caller. One CPU, no Serve: the transport alone (test_fleet_ray.py runs
the whole fleet)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from fastapi import FastAPI, Request

from vidloom.fleet.forward import forwarded_request, run_forwarded
from vidloom.serving.api_keys import CALLER_SCOPE_KEY, Caller, caller_of

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def _who_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/videos")
    async def who(request: Request) -> dict:
        caller = caller_of(request.scope)
        return {"owner": caller.owner, "admin": caller.admin, "body": (await request.body()).decode()}

    return app


def _replica(forwarded: dict) -> tuple[int, dict, int]:
    """In a Ray worker process: run the forwarded request through a route, as a replica does."""
    async def run() -> list:
        return [message async for message in run_forwarded(_who_app(), forwarded, asyncio.get_running_loop())]

    messages = asyncio.run(run())
    return messages[0]["status"], json.loads(b"".join(m.get("body", b"") for m in messages[1:])), os.getpid()


def test_the_caller_crosses_ray_to_the_replica(monkeypatch):
    async def receive() -> dict:
        return {"type": "http.request", "body": b'{"prompt": "a heron"}', "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/videos", "query_string": b"",
             "headers": [(b"authorization", b"Bearer sk-alice"), (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 8000), CALLER_SCOPE_KEY: Caller("alice", False)}
    forwarded = asyncio.run(forwarded_request(Request(scope, receive)))
    assert (b"authorization", b"Bearer sk-alice") not in forwarded["headers"]  # the key stays at the ingress
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a throwaway local cluster on loopback
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False)
    try:
        status, seen, pid = ray.get(ray.remote(_replica).remote(forwarded), timeout=120)
    finally:
        ray.shutdown()
    assert pid != os.getpid(), "ran in the driver, not a Ray worker"
    assert status == 200 and seen == {"owner": "alice", "admin": False, "body": '{"prompt": "a heron"}'}
