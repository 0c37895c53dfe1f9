"""Chat completions that answer aloud (modalities ["text", "audio"]): the reply is written by the thinker and
spoken by the talker in one speech request on the engine.

Non-streamed: `message.audio` = {id, data (base64 of the encoded file), expires_at, transcript}, `content` null,
as OpenAI answers. Streamed: `delta.audio.transcript` pieces while the thinker writes, then `delta.audio.data`
pieces (base64), each piece of the encoded stream as soon as a decoded chunk has been encoded, while the
talker decodes (serving.speech_stream); then `delta.audio.expires_at`, the finish reason and [DONE]. A client
that leaves cancels the request (both KV sequences return at the next step).
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from vidloom.core.output import Event
from vidloom.core.speech import SpeechRequest, SpeechResult
from vidloom.media.speech_audio import encode_speech
from vidloom.runtime.chat_stream import event_queue
from vidloom.serving.chat_params import PlannedChat
from vidloom.serving.chat_protocol import (
    AssistantMessage, AudioAnswer, ChatCompletion, ChatCompletionChunk, Choice, ChunkChoice, Delta, Usage,
)
from vidloom.serving.disconnect import result_or_cancel
from vidloom.serving.errors import engine_errors, error_json
from vidloom.serving.request_budget import Deadline
from vidloom.serving.speech_stream import stream_speech_request, streamed_bytes

AUDIO_TTL_S = 3600  # expires_at: audio ids are not kept for multi-turn reuse here; the hour is OpenAI's
_SPEECH_FORMAT = {"pcm16": "pcm"}  # chat's format names -> /v1/audio/speech's


async def audio_chat(request: Request, manager: Any, planned: PlannedChat,
                     media: bool = False) -> ChatCompletion | StreamingResponse:
    """Answer `planned` aloud; `media`: its messages have audio or image parts, whose features are prepared on the
    media pool."""
    voice, fmt = planned.audio  # type: ignore[misc]
    engine = manager.engine
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Event] = asyncio.Queue()
    # The chat's seed also seeds the talker and token2wav, as the Python API's chat(..., audio=...) does.
    speech = SpeechRequest(chat=planned.request, voice=voice, request_id=planned.request.request_id,
                           seed=planned.request.sampling.seed)
    if planned.stream:  # the audio leaves chunk by chunk while the talker decodes
        speech = stream_speech_request(speech)
    budget = request.app.state.chat.budget  # its up-front check ran before the media (chat_routes)
    with engine_errors():
        sink = event_queue(loop, queue, speech.request_id)
        handle = (await engine.submit_prepared_by(speech, manager.media.run, sink) if media
                  else engine.submit(speech, sink))
    audio_id = f"audio_{uuid.uuid4().hex}"
    if planned.stream:
        return StreamingResponse(_sse(manager, planned, handle, queue, audio_id, fmt, budget.deadline()),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    result: SpeechResult = await budget.run("audio_chat", lambda done: done.text_tokens,
                                            result_or_cancel(request, engine, handle, speech.request_id),
                                            lambda: engine.cancel(speech.request_id))
    data = await manager.media.run(encode_speech, result.audio, result.sample_rate, _SPEECH_FORMAT.get(fmt, fmt))
    answer = AudioAnswer(id=audio_id, data=base64.b64encode(data).decode(), expires_at=int(time.time()) + AUDIO_TTL_S,
                         transcript=result.text)
    choice = Choice(message=AssistantMessage(content=None, audio=answer), finish_reason=_finish(planned, result))
    return ChatCompletion(id=speech.request_id, created=int(time.time()), model=manager.card.model_id,
                          choices=[choice], usage=_usage(handle.run, result))


async def _sse(manager: Any, planned: PlannedChat, handle: Any, queue: asyncio.Queue[Event], audio_id: str,
               fmt: str, deadline: Deadline) -> AsyncIterator[bytes]:
    request_id, created, model = planned.request.request_id, int(time.time()), manager.card.model_id

    def chunk(delta: Delta, finish: str | None = None) -> bytes:
        body = ChatCompletionChunk(id=request_id, created=created, model=model,
                                   choices=[ChunkChoice(delta=delta, finish_reason=finish)])  # type: ignore[arg-type]
        return f"data: {body.model_dump_json(exclude_none=True)}\n\n".encode()

    ended = False
    try:
        yield chunk(Delta(role="assistant"))
        async for piece in streamed_bytes(queue, _SPEECH_FORMAT.get(fmt, fmt), 1.0, manager.media.run):
            deadline.check(lambda: manager.engine.cancel(request_id))
            if isinstance(piece, str):
                yield chunk(Delta(audio={"id": audio_id, "transcript": piece}))
            else:
                yield chunk(Delta(audio={"id": audio_id, "data": base64.b64encode(piece).decode()}))
        ended = True
        with engine_errors():
            result: SpeechResult = await handle.result()
        deadline.done("audio_chat", result.text_tokens)
        yield chunk(Delta(audio={"id": audio_id, "expires_at": int(time.time()) + AUDIO_TTL_S}),
                    _finish(planned, result))
    except Exception as exc:  # headers are sent: the failure travels as an error event, then [DONE]
        yield f"data: {error_json(exc)}\n\n".encode()
    finally:
        if not ended:  # the client left: cancel, which frees the thinker's blocks and the talker's slab
            manager.engine.cancel(request_id)
    yield b"data: [DONE]\n\n"


def _finish(planned: PlannedChat, result: SpeechResult) -> str:
    budget = planned.request.sampling.max_tokens
    return "length" if budget is not None and result.text_tokens >= budget else "stop"


def _usage(run: Any, result: SpeechResult) -> Usage:
    prompt = len(run.inputs["speech"].prompt_ids)
    completion = result.text_tokens + result.audio_tokens
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

