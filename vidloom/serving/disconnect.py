"""Run a request's work only while its client is connected: a disconnect cancels it (at the next step boundary)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Awaitable, TypeVar

from fastapi import Request

from vidloom.runtime.async_engine import AsyncEngine, JobHandle
from vidloom.serving.errors import APIError, engine_errors

T = TypeVar("T")


class ClientDisconnected(APIError):
    """The client went away before the answer was ready; nobody reads this response (nginx calls it 499)."""

    def __init__(self) -> None:
        super().__init__(499, "client closed the request", code="client_closed_request")


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it (its CancelledError handler frees the slot).

    Starlette does not cancel a handler when its client leaves, so a one-shot render (the
    images route) would otherwise hold its device slot to the end for nobody.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientDisconnected()
    finally:
        watcher.cancel()
        if not task.done():  # this handler itself was cancelled (server shutdown)
            task.cancel()


async def result_or_cancel(request: Request, engine: AsyncEngine, handle: JobHandle, request_id: str) -> Any:
    """The run's result (engine errors as API errors); if the client leaves, the run fails or the server stops
    first, the run is cancelled on the engine, so that what it holds (a speech run's KV) returns now."""
    finished = False
    try:
        with engine_errors():
            result = await unless_disconnected(request, handle.result())
        finished = True
    finally:
        if not finished:
            engine.cancel(request_id)
    return result


async def _disconnected(request: Request) -> None:
    # The body has been read, so the next message on the channel is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
