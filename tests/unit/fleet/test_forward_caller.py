"""A request the fleet's ingress forwards carries its caller (the key's owner and role) to the replica's routes."""

from __future__ import annotations

import asyncio
import json
import pickle

from fastapi import FastAPI, Request

from vidloom.fleet.forward import forwarded_request, run_forwarded
from vidloom.serving.api_keys import CALLER_SCOPE_KEY, Caller, caller_of


def test_the_replica_sees_the_ingress_caller():
    replica = FastAPI()

    @replica.get("/who")
    async def who(request: Request) -> dict:
        caller = caller_of(request.scope)
        return {"owner": caller.owner, "admin": caller.admin}

    async def body() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def run() -> list:
        scope = {"type": "http", "method": "GET", "path": "/who", "query_string": b"", "headers": [],
                 "client": None, "server": None, CALLER_SCOPE_KEY: Caller("alice", False)}
        forwarded = pickle.loads(pickle.dumps(await forwarded_request(Request(scope, body))))  # as Ray sends it
        return [message async for message in run_forwarded(replica, forwarded, asyncio.get_running_loop())]

    messages = asyncio.run(run())
    assert messages[0]["status"] == 200
    assert json.loads(b"".join(m.get("body", b"") for m in messages[1:])) == {"owner": "alice", "admin": False}
