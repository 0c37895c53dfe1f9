"""POST /v1/audio/speech (OpenAI's shape): speak `input` in `voice`, as a file, a chunked stream or SSE events.

The request is one run of the model's speech program (thinker -> talker -> token2wav -> vocoder)
submitted to the same engine as every other request; refused input is a 400 naming the field before
anything runs. A client that leaves cancels the run, which returns its KV (pool blocks and talker
slab) at the next step. The waveform is encoded on the media pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from typing import Any, AsyncIterator, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict

from vidloom.core.errors import InvalidRequest
from vidloom.core.speech import SpeechRequest, SpeechResult, voice_from_openai
from vidloom.media.speech_audio import MEDIA_TYPES, check_format, check_speed, encode_speech, time_stretch
from vidloom.runtime.chat_stream import event_queue
from vidloom.serving.disconnect import result_or_cancel
from vidloom.serving.errors import engine_errors, error_json
from vidloom.serving.params import check_model
from vidloom.serving.protocol import ApiFloat, ApiInt, body_doc
from vidloom.serving.request_body import read_body
from vidloom.serving.request_budget import RequestBudget
from vidloom.serving.speech_stream import stream_speech_request, streamed_bytes
from vidloom.serving.video_routes import jobs_of

router = APIRouter(prefix="/v1/audio")


class SpeechBody(BaseModel):
    """OpenAI's speech request. `speed` (0.25 to 4) stretches time without changing the pitch (ffmpeg's atempo)."""

    model_config = ConfigDict(extra="forbid")

    input: Any = None
    model: str | None = None
    voice: Any = None
    instructions: str | None = None
    response_format: str = "mp3"
    speed: ApiFloat = 1.0
    stream_format: Literal["audio", "sse"] | None = None
    seed: ApiInt | None = None  # vidloom extension (as chat's): the same seed speaks the same audio


def plan_speech(body: SpeechBody, card: Any) -> SpeechRequest:
    """The engine's request from the body; InvalidRequest naming the field (the engine validates the request
    and checks that the model speaks when it is submitted)."""
    check_model(body.model, card)
    if not isinstance(body.input, str):
        raise InvalidRequest("input", "must be a string")
    voice = voice_from_openai(body.voice, "voice")
    check_format(body.response_format)
    check_speed(body.speed)
    return SpeechRequest(text=body.input, voice=voice, instructions=body.instructions, seed=body.seed)


@router.post("/speech", response_model=None, openapi_extra=body_doc(SpeechBody))
async def create_speech(request: Request) -> Response:
    manager = jobs_of(request)
    body = await read_body(request, SpeechBody)
    engine, budget = manager.engine, request.app.state.chat.budget
    with engine_errors():
        speech = plan_speech(body, manager.card)
        budget.check("speech", len(body.input), "input", "characters")
        if body.stream_format is not None:
            return _progressive(manager, speech, body, budget)
        handle = engine.submit(speech)
    result: SpeechResult = await budget.run("speech", lambda _: len(body.input),
                                            result_or_cancel(request, engine, handle, speech.request_id),
                                            lambda: engine.cancel(speech.request_id))
    fmt = body.response_format
    if body.speed != 1.0:
        audio = await manager.media.run(time_stretch, result.audio, result.sample_rate, body.speed)
        result = dataclasses.replace(result, audio=audio)
    data = await manager.media.run(encode_speech, result.audio, result.sample_rate, fmt)
    return Response(data, media_type=MEDIA_TYPES[fmt], headers={"X-Request-Id": speech.request_id})


def _progressive(manager: Any, speech: SpeechRequest, body: SpeechBody, budget: RequestBudget) -> StreamingResponse:
    """The audio while the talker decodes: each decoded chunk's encoded bytes leave at once (chunked transfer,
    or one speech.audio.delta event per piece); the run is cancelled if the client leaves."""
    engine, fmt = manager.engine, body.response_format
    speech = stream_speech_request(speech)
    queue: asyncio.Queue = asyncio.Queue()
    sink = event_queue(asyncio.get_running_loop(), queue, speech.request_id)
    handle = engine.submit(speech, sink)
    sse = body.stream_format == "sse"

    async def pieces() -> AsyncIterator[bytes]:
        ended, deadline = False, budget.deadline()
        try:
            async for data in streamed_bytes(queue, fmt, body.speed, manager.media.run):
                deadline.check(lambda: engine.cancel(speech.request_id))
                if isinstance(data, bytes):  # (the text is the input's)
                    yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}) if sse else data
            ended = True
            with engine_errors():
                result: SpeechResult = await handle.result()
            deadline.done("speech", len(speech.text or ""))
            if sse:
                yield _event({"type": "speech.audio.done", "usage": _usage(result)})
        except Exception as exc:
            if not sse:
                raise  # headers are sent: the connection is cut, the client sees a truncated body
            yield f"data: {error_json(exc)}\n\n".encode()
        finally:
            if not ended:  # the client left (or the run failed): its KV returns at the next step
                engine.cancel(speech.request_id)

    if sse:
        return StreamingResponse(pieces(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return StreamingResponse(pieces(), media_type=MEDIA_TYPES[fmt], headers={"X-Request-Id": speech.request_id})


def _usage(result: SpeechResult) -> dict[str, int]:
    return {"input_tokens": result.text_tokens, "output_tokens": result.audio_tokens,
            "total_tokens": result.text_tokens + result.audio_tokens}


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()

