"""POST /v1/chat/completions on the AsyncEngine's chat (AR decode) path: one answer, or SSE chunks ending in [DONE].

The engine is asked for the first item before any byte is sent, so a refused request (bad input,
KV pool full, queue full) gets its HTTP status; later failures arrive as an error chunk. A client
that goes away closes the engine's iterator, which frees the sequence at the next decode step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Callable, Iterator

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from vidloom.core.chat import ChatResult, TokenDelta
from vidloom.core.errors import CacheBudgetExceeded, InvalidRequest, VidloomError
from vidloom.serving.chat_audio import audio_chat
from vidloom.serving.chat_media import ChatMediaAdmission, chat_media_bytes
from vidloom.serving.chat_metrics import ChatMetrics
from vidloom.serving.chat_params import PlannedChat, has_media_parts, plan_chat, spoken_max_tokens
from vidloom.serving.chat_protocol import (
    AssistantMessage, ChatCompletion, ChatCompletionBody, ChatCompletionChunk, Choice, ChunkChoice, Delta, Usage,
)
from vidloom.serving.config import ServeConfig
from vidloom.serving.disconnect import unless_disconnected
from vidloom.serving.errors import APIError, engine_errors, error_json, generation_error
from vidloom.serving.jobs import JobManager
from vidloom.serving.metrics import ServerMetrics
from vidloom.serving.protocol import body_doc
from vidloom.serving.request_body import read_body
from vidloom.serving.request_budget import RequestBudget
from vidloom.serving.video_routes import jobs_of

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/chat")
CHAT_RETRY_AFTER_S = 1  # a full KV pool frees blocks as soon as any running sequence finishes
CHAT_STOP_WAIT_S = 2.0  # at shutdown, how long stopped chats get to send their last event
DONE = b"data: [DONE]\n\n"
ChatItems = AsyncIterator[TokenDelta | ChatResult]


class ChatState:
    """A server's chat side: its /metrics series (None for a model that does not chat), its open requests, the
    admission of chats' media (serving/chat_media.py) and the time budget of speech runs (serving/request_budget.py,
    spoken chats and /v1/audio/speech alike)."""

    def __init__(self, manager: JobManager, config: ServeConfig) -> None:
        chats = "ar_decode" in manager.card.loops
        self.metrics = ChatMetrics(manager.metrics.registry, manager.engine.chat_stats) if chats else None
        self.open = 0  # chat requests whose engine stream is open (from submission to their last item)
        self.media = ChatMediaAdmission(config.max_chat_media_bytes, config.chat_media_budget_bytes)
        self.budget = RequestBudget(config.max_request_seconds)  # speech runs: spoken chats and /v1/audio/speech


async def drain_chats(app: Any, grace_s: float) -> None:
    """Shutdown: give open chats `grace_s` to finish, then stop the rest at their next token so each stream
    still ends with an error event and [DONE] instead of being cut when the server closes connections."""
    state: ChatState | None = getattr(app.state, "chat", None)
    if state is None or state.metrics is None:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while state.open and loop.time() < deadline:
        await asyncio.sleep(0.05)
    if not state.open:
        return
    log.warning("shutdown grace period of %.1fs over: stopping %d chat request(s)", grace_s, state.open)
    if app.state.jobs.engine.cancel_chats():
        stop_by = loop.time() + CHAT_STOP_WAIT_S
        while state.open and loop.time() < stop_by:
            await asyncio.sleep(0.02)


@router.post("/completions", response_model=None, openapi_extra=body_doc(ChatCompletionBody))
async def chat_completions(request: Request) -> ChatCompletion | StreamingResponse:
    received = time.perf_counter()
    manager = jobs_of(request)
    body = await read_body(request, ChatCompletionBody)
    rename = _renamer(body)
    with engine_errors(rename), contextlib.ExitStack() as held:  # the engine checks the sampling limits (its KV
        # pool bounds max_tokens). Decoding media parts, then their features (Whisper mels, image patches), is work
        # for the media pool, never the event loop, admitted first from the parts' headers (serving/chat_media.py).
        spoken = spoken_max_tokens(body)
        if spoken is not None:  # a spoken answer's time budget (request_budget.py), before any media part is read
            request.app.state.chat.budget.check("audio_chat", spoken, "max_tokens", "tokens")
        media = has_media_parts(body)
        if media:
            nbytes = await manager.media.run(chat_media_bytes, body.messages)
            held.enter_context(request.app.state.chat.media.admitted(nbytes))
            planned = await manager.media.run(plan_chat, body, manager.card)
        else:
            planned = plan_chat(body, manager.card)
        if planned.audio is not None:  # a spoken answer: one speech request (thinker -> talker -> vocoder)
            return await audio_chat(request, manager, planned, media)
        chat = (await manager.engine.chat_prepared_by(planned.request, manager.media.run) if media
                else manager.engine.chat(planned.request))
        items = _observed(chat, manager.metrics, request.app.state.chat, received)
    try:
        with engine_errors(rename), _admission_errors():
            first = await unless_disconnected(request, anext(items))
            if planned.stream:
                return StreamingResponse(
                    _sse(planned, manager.card.model_id, first, items), media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            result = first if isinstance(first, ChatResult) else await unless_disconnected(request, _last(items))
    except (APIError, VidloomError):
        await _close(items)
        raise
    except Exception as exc:  # a model step that raised (the engine passes its error through): the server's fault
        await _close(items)
        raise generation_error(exc) from None
    except BaseException:
        await _close(items)
        raise
    await _close(items)
    return _completion(planned, manager.card.model_id, _successful(result))


async def _sse(
    planned: PlannedChat, model: str, first: TokenDelta | ChatResult, items: ChatItems,
) -> AsyncIterator[bytes]:
    """The chunks: the role first, a chunk per piece of text, the finish reason, usage if asked, then [DONE]."""
    request_id, created = planned.request.request_id, int(time.time())

    def chunk(delta: Delta, finish: str | None = None) -> bytes:
        choice = ChunkChoice(delta=delta, finish_reason=finish)  # type: ignore[arg-type]
        body = ChatCompletionChunk(id=request_id, created=created, model=model, choices=[choice])
        return _event(body.model_dump_json(exclude_none=True))

    try:
        yield chunk(Delta(role="assistant", content=""))
        item = first
        while isinstance(item, TokenDelta):
            if item.text:
                yield chunk(Delta(content=item.text))
            item = await anext(items)
        result = _successful(item)
        yield chunk(Delta(), result.finish_reason)
        if planned.include_usage:
            usage = ChatCompletionChunk(id=request_id, created=created, model=model, choices=[], usage=_usage(result))
            yield _event(usage.model_dump_json())
    except Exception as exc:
        # Headers are sent: the failure travels as an error event (as vLLM sends it), then [DONE].
        yield _event(error_json(exc))
    finally:
        await _close(items)
    yield DONE


async def _observed(items: ChatItems, server: ServerMetrics, state: ChatState, received: float) -> ChatItems:
    """The engine's items, observing time to first token, inter-token latency and how the request ended."""
    last, yielded, chat = None, False, state.metrics
    status: str | None = "cancelled"  # closed before its result: the client left (or the server stopped)
    state.open += 1
    try:
        async for item in items:
            if chat is not None and isinstance(item, TokenDelta) and item.token_ids:
                now = time.perf_counter()
                if last is None:
                    chat.first_token(now - received)
                    if len(item.token_ids) > 1:
                        chat.next_tokens(0.0, len(item.token_ids) - 1)
                else:
                    chat.next_tokens(now - last, len(item.token_ids))
                last = now
            if isinstance(item, ChatResult) and item.finish_reason in ("stop", "length"):
                status = "completed"
            yielded = True
            yield item
    except (InvalidRequest, CacheBudgetExceeded):
        status = "failed" if yielded else None  # refused at admission: counted as a rejection (400 / 429)
        raise
    except Exception:
        status = "failed"
        raise
    finally:
        state.open -= 1
        await _close(items)  # closing this wrapper must reach the engine's iterator too
        if status is not None:
            server.finished("chat", status, time.perf_counter() - received)


async def _last(items: ChatItems) -> ChatResult:
    async for item in items:
        if isinstance(item, ChatResult):
            return item
    raise VidloomError("the chat stream ended without a result")


async def _close(items: ChatItems) -> None:
    """Close the engine's iterator (cancels and frees the sequence); shielded, as a disconnect cancels us."""
    with anyio.CancelScope(shield=True):
        await items.aclose()


def _successful(item: TokenDelta | ChatResult) -> ChatResult:
    if not isinstance(item, ChatResult):
        raise VidloomError("the chat stream ended without a result")
    if item.finish_reason not in ("stop", "length"):  # cancelled by the server (shutdown)
        raise APIError(503, "the request was stopped by the server (shutting down)", code="shutting_down")
    return item


@contextlib.contextmanager
def _admission_errors() -> Iterator[None]:
    """A full KV pool is a 429 to retry; a request larger than the whole pool is a 400 (it never fits)."""
    try:
        yield
    except CacheBudgetExceeded as exc:
        if exc.needed > exc.budget:
            raise APIError(400, f"max_tokens: the request does not fit in this server's KV cache even when it is "
                                f"empty: {exc}", param="max_tokens", code="limit_exceeded") from None
        raise APIError(429, f"the KV cache is full: {exc}", code="kv_cache_full",
                       headers={"Retry-After": str(CHAT_RETRY_AFTER_S)}) from None


def _renamer(body: ChatCompletionBody) -> Callable[[str], str]:
    """A request field as the client named it (max_tokens arrives as max_completion_tokens from newer clients)."""
    sent_new = body.max_completion_tokens is not None
    return lambda field: "max_completion_tokens" if field == "max_tokens" and sent_new else field


def _completion(planned: PlannedChat, model: str, result: ChatResult) -> ChatCompletion:
    message = AssistantMessage(content=result.text)
    choice = Choice(message=message, finish_reason=result.finish_reason)  # type: ignore[arg-type]
    return ChatCompletion(id=planned.request.request_id, created=int(time.time()), model=model, choices=[choice],
                          usage=_usage(result))


def _usage(result: ChatResult) -> Usage:
    return Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                 total_tokens=result.prompt_tokens + result.completion_tokens)


def _event(data: str) -> bytes:
    return f"data: {data}\n\n".encode()
