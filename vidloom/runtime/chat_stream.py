"""Chat streams over the one engine: a chat is a request like any other, stepped by whoever owns the device.

`stream_alone` steps one chat in the caller's thread (the sync Python API). The AsyncEngine's side
(`ChatFrontend`) submits it to the same scheduler as generation requests (it holds a decode slot,
counts in queue depth and in flight, and is cancelled by request id like any job); the device
worker decodes it in one forward with every other running sequence. Both turn the run's events
into what a chat caller reads: TokenDeltas, then the ChatResult.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Iterator

from vidloom.core.chat import ChatRequest, ChatResult, TokenDelta
from vidloom.core.errors import Cancelled
from vidloom.core.output import (AudioChunkEvent, CancelledEvent, CompletedEvent, Event, FailedEvent,
                                 TextEvent)
from vidloom.runtime.engine import EngineDriver
from vidloom.runtime.request_run import RequestRun
from vidloom.runtime.paged_decode import no_chat
from vidloom.runtime.results import chat_result

if TYPE_CHECKING:
    from vidloom.runtime.async_engine import AsyncEngine, JobHandle

log = logging.getLogger(__name__)
ChatItem = TokenDelta | ChatResult
Offload = Callable[..., Awaitable[Any]]  # runs fn(*args) on another thread: a media pool's `run`


def delta_of(event: Event) -> TokenDelta | None:
    """The TokenDelta a chat run's TextEvent carries (None for its other events)."""
    if isinstance(event, TextEvent):
        return TokenDelta(event.request_id, event.text, event.token_ids)
    return None


def cancelled_result(run: RequestRun, deltas: list[TokenDelta]) -> ChatResult:
    """What a stopped chat had written, marked "cancelled" (never sent to a client as a success)."""
    tokens = tuple(t for d in deltas for t in d.token_ids)
    prompt_ids = run.inputs["chat"].prompt_ids
    return ChatResult(run.request.request_id, "".join(d.text for d in deltas), "cancelled", len(prompt_ids),
                      len(tokens), 0.0, tokens)


def stream_alone(engine: EngineDriver, request: ChatRequest) -> Iterator[ChatItem]:
    """Run `request` to the end in this thread: its deltas, then its ChatResult.

    For the sync API, where nothing else steps the engine. InvalidRequest / CacheBudgetExceeded raise
    before the first item; closing the iterator early ends the run and returns its blocks at once.
    """
    events: list[Event] = []
    run = engine.submit(request, events.append)
    try:
        while True:
            done = run.step()
            ready, events[:] = list(events), []
            for event in ready:
                delta = delta_of(event)
                if delta is not None:
                    yield delta
            if done:
                yield chat_result(run.outputs())
                return
    finally:
        run.close()


async def stream_submitted(handle: JobHandle, queue: asyncio.Queue[Event],
                           cancel: Callable[[str], bool]) -> AsyncIterator[ChatItem]:
    """The items of a submitted chat (`handle`: its JobHandle; `queue`: its events, fed from the worker)."""
    seen: list[TokenDelta] = []
    ended = False
    try:
        while True:
            event = await queue.get()
            delta = delta_of(event)
            if delta is not None:
                seen.append(delta)
                yield delta
            elif isinstance(event, (CompletedEvent, FailedEvent, CancelledEvent)):
                break
        ended = True
        try:
            result = await handle.result()
        except Cancelled:  # stopped by the engine (shutdown): the caller learns how far it got
            result = cancelled_result(handle.run, seen)
        yield result
    finally:
        if not ended:  # the caller left (aclose, a client that went away): one cancellation path for every job
            cancel(handle.request_id)


def event_queue(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Event], request_id: str):
    """A worker-thread event callback that hands a chat's text, a streamed speech request's audio chunks and
    their end to `queue` on `loop`."""

    def sink(event: Event) -> None:
        if not isinstance(event, (TextEvent, AudioChunkEvent, CompletedEvent, FailedEvent, CancelledEvent)):
            return  # progress and "started": nothing a chat stream shows, and each hand-off wakes the event loop
        try:
            loop.call_soon_threadsafe(queue.put_nowait, event)
        except RuntimeError:  # the caller's event loop is gone: nobody reads this stream any more
            log.debug("chat event for %s dropped: event loop closed", request_id)

    return sink


class ChatFrontend:
    """AsyncEngine's chat side: a chat is submitted like any request (`submit`), its events streamed."""

    def chat(self: AsyncEngine, request: ChatRequest) -> AsyncIterator[ChatItem]:
        """Stream `request`'s TokenDeltas, then its ChatResult (finish_reason "cancelled" if the engine stopped it).

        Raises at once: InvalidRequest("model") on a model without a chat loop, InvalidRequest naming the field,
        EngineBusy (queue full), EngineClosed. CacheBudgetExceeded (KV pool full) raises before the first item.
        """
        self._check_chat()
        queue: asyncio.Queue[Event] = asyncio.Queue()
        handle = self.submit(request, event_queue(asyncio.get_running_loop(), queue, request.request_id))
        return stream_submitted(handle, queue, self.cancel)

    async def chat_prepared_by(self: AsyncEngine, request: ChatRequest, offload: Offload) -> AsyncIterator[ChatItem]:
        """As `chat`, with the request's preparation (its prompt, a model's audio features and image patches) run
        by `offload(fn, *args)` (a thread pool's run), so a chat with media does no such work on the event loop."""
        self._check_chat()
        queue: asyncio.Queue[Event] = asyncio.Queue()
        sink = event_queue(asyncio.get_running_loop(), queue, request.request_id)
        return stream_submitted(await self.submit_prepared_by(request, offload, sink), queue, self.cancel)

    def _check_chat(self: AsyncEngine) -> None:
        """A model without a chat loop is refused at once (before an event loop or an offload is involved)."""
        if self.decoder is None:
            raise no_chat(self.card.model_id)

    def chat_stats(self: AsyncEngine) -> dict[str, int]:
        """tokens_generated_total, kv_blocks_in_use, kv_blocks_total (zeros on a model without chat)."""
        if self.decoder is None:
            return {"tokens_generated_total": 0, "kv_blocks_in_use": 0, "kv_blocks_total": 0}
        return self.decoder.stats()
