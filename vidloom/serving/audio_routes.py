"""POST /v1/audio/generations: text to audio on an audio-only model (Stable Audio), answered directly.

OpenAI has no text-to-audio (sound) endpoint: /v1/audio/speech is text-to-speech with a voice, its body names a
voice and returns raw bytes. This route is shaped like /v1/images/generations instead: a JSON body (prompt,
seconds, the sampling extensions), answered when the clip is ready with its file base64-encoded in
`data[0].b64_json`, plus the sample rate and duration. With `"background": true` it is a job instead (the
jobs API: GET /v1/videos/{id}, its SSE events, and the WAV at /v1/videos/{id}/content?variant=audio). Runs
through the same engine, admission, limits and metrics as images and videos (docs/audio.md).

An initial waveform (`init_audio`, Stable Audio) is a file part of a multipart/form-data body, as the Images
API's edits and the Videos API take their uploads; it is decoded on the media pool, its length bounded by the
server's max_init_audio_seconds and its bytes by max_body_bytes.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fastapi import APIRouter, Request
from pydantic import BaseModel

from vidloom.core.card import ModelCard
from vidloom.core.errors import InvalidRequest
from vidloom.core.output import VideoOutput
from vidloom.core.request import GenerationRequest, Task
from vidloom.media.request_inputs import resolve_request
from vidloom.media.audio import AudioTrack
from vidloom.media.audio_files import AUDIO_FILE_FORMATS, write_audio_only
from vidloom.media.audio_upload import open_audio_upload
from vidloom.serving.disconnect import unless_disconnected
from vidloom.serving.errors import engine_errors
from vidloom.serving.params import PlannedVideo, check_model, new_video_id, sampling_fields
from vidloom.serving.protocol import ApiBool, SamplingExtensions, VideoObject, body_doc
from vidloom.serving.option_bodies import read_options_body
from vidloom.serving.option_fields import option_values
from vidloom.serving.api_keys import caller_of
from vidloom.serving.video_routes import AUDIO_JOB_SIZE, jobs_of

router = APIRouter(prefix="/v1/audio")
OUTPUT_FORMATS = tuple(ext.lstrip(".") for ext in AUDIO_FILE_FORMATS)  # wav (default) | flac | mp3 | ogg


class AudioGenerationBody(SamplingExtensions):
    """POST /v1/audio/generations."""

    prompt: str
    model: str | None = None
    # The served model's audio_length block adds seconds and seconds_start (serving.option_fields).
    response_format: str | None = None  # b64_json (the only one)
    output_format: str | None = None  # wav (default) | flac | mp3 | ogg
    background: ApiBool = False  # true: answer with a job (its content: variant=audio, a WAV)
    init_audio: Any = None  # multipart file part: the waveform the clip starts from (cards that take init_audio)


class AudioData(BaseModel):
    b64_json: str


class AudioResponse(BaseModel):
    created: int
    data: list[AudioData]
    output_format: str
    sample_rate: int
    seconds: float
    seed: int


@router.post("/generations", openapi_extra=body_doc(AudioGenerationBody, "application/json", "multipart/form-data"))
async def generate_audio(request: Request) -> AudioResponse | VideoObject:
    """Text to audio; answers when the clip is ready (one clip per call), or at once with a job (background)."""
    manager = jobs_of(request)
    body = await read_options_body(request, AudioGenerationBody)
    with engine_errors():
        planned, output_format = plan_audio(body, manager.card)
        if body.init_audio is not None and "init_audio" in manager.card.inputs:  # else resolving refuses it
            planned = dataclasses.replace(planned, init_audio=await manager.media.run(
                uploaded_audio, body.init_audio, manager.card, request.app.state.config.max_init_audio_seconds))
        if body.background:
            if output_format != "wav":
                raise InvalidRequest("output_format", "a background job stores WAV; convert it, or answer directly")
            resolved = resolve_request(planned, manager.card)
            length = resolved.option("seconds")
            seconds = "" if length is None else f"{length:g}"  # None: a fixed-length model
            record = manager.submit_video(PlannedVideo(resolved, AUDIO_JOB_SIZE, seconds), caller_of(request.scope).owner)
            return VideoObject.from_record(record)
        outputs = await unless_disconnected(request, manager.generate_images((planned,)))
    output = outputs[0]
    encoded = await asyncio.to_thread(encode_audio, output, output_format)
    return AudioResponse(created=int(time.time()), data=[AudioData(b64_json=base64.b64encode(encoded).decode())],
                         output_format=output_format, sample_rate=int(output.sample_rate or 0),
                         seconds=output.duration_s, seed=int(output.metadata["seed"]))


def plan_audio(body: AudioGenerationBody, card) -> tuple[GenerationRequest, str]:
    """The request and file format of one call; InvalidRequest names the field."""
    check_model(body.model, card)
    if Task.T2A not in card.tasks:
        raise InvalidRequest("model", f"{card.model_id} does not make audio clips (it serves "
                                      f"{', '.join(sorted(t.value for t in card.tasks)) or 'chat'})")
    if body.response_format not in (None, "b64_json"):
        raise InvalidRequest("response_format", f"must be b64_json, got {body.response_format!r}")
    if body.init_audio is not None and "init_audio" not in card.inputs:
        raise InvalidRequest("init_audio", f"{card.model_id} does not start clips from an initial waveform")
    output_format = body.output_format or "wav"
    if output_format not in OUTPUT_FORMATS:
        raise InvalidRequest("output_format", f"must be one of {', '.join(OUTPUT_FORMATS)}, got {body.output_format!r}")
    request = GenerationRequest(prompt=body.prompt, task=Task.T2A, request_id=new_video_id(),
                                options=option_values(body, card), **sampling_fields(body))
    return request, output_format


def uploaded_audio(value: Any, card: ModelCard, max_seconds: float | None) -> np.ndarray:
    """An init_audio file part as the waveform the request carries (on the media pool: it decodes)."""
    if not isinstance(value, bytes):
        raise InvalidRequest("init_audio", "must be an uploaded audio file (a multipart/form-data file part)")
    assert card.audio is not None  # a card that takes init_audio is audio-only (see the caller)
    limit = card.audio.max_seconds if max_seconds is None else max_seconds
    return open_audio_upload(value, "init_audio", card.audio.sample_rate, limit)


def encode_audio(output: VideoOutput, output_format: str) -> bytes:
    """The output's waveform as a file of `output_format`, in memory (written to a temporary file first)."""
    track = AudioTrack(output.audio, output.sample_rate)
    with tempfile.TemporaryDirectory(prefix="vidloom-audio-") as folder:
        path = write_audio_only(track, Path(folder) / f"clip.{output_format}")
        return path.read_bytes()
