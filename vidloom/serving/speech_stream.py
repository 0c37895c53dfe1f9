"""Speech that streams while the talker decodes: audio chunks (AudioChunkEvents of a request with
`audio_chunk_codes`) turned into bytes of the requested format as they arrive.

Every format streams: pcm and wav a piece at a time (a WAV stream's header gives its sizes as unknown,
0xFFFFFFFF, as streamed WAV from OpenAI's API does), mp3, opus, aac and flac through one encoder kept
open for the utterance, and a `speed` other than 1 through one atempo chain fed chunk by chunk
(media.speech_encoder). Encoding runs on the server's media threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, AsyncIterator, Awaitable, Callable

from vidloom.core.output import AudioChunkEvent, CancelledEvent, CompletedEvent, Event, FailedEvent, TextEvent
from vidloom.media.speech_encoder import SpeechStreamEncoder

STREAM_CHUNK_CODES = 25  # codes of the first streamed chunk: 0.5 s of speech at Qwen2.5-Omni's 50 codes/s

RunOnMedia = Callable[..., Awaitable[Any]]  # the media pool's run(fn, *args)


async def streamed_bytes(queue: asyncio.Queue[Event], fmt: str, speed: float,
                         run: RunOnMedia) -> AsyncIterator[bytes | str]:
    """The request's audio as `fmt` bytes (at `speed`), each piece as soon as the encoder has written it, and
    the text it writes (a str per TextEvent, in order), until its run ends (the caller then awaits the run's
    result, which raises if it failed)."""
    encoder: SpeechStreamEncoder | None = None
    try:
        while True:
            event = await queue.get()
            if isinstance(event, TextEvent) and event.text:
                yield event.text
            elif isinstance(event, AudioChunkEvent):
                if encoder is None:
                    encoder = await run(SpeechStreamEncoder, fmt, event.sample_rate, speed)
                data = await run(encoder.feed, event.audio)
                if data:
                    yield data
            elif isinstance(event, CompletedEvent):
                if encoder is not None:
                    data, encoder = await run(encoder.finish), None
                    if data:
                        yield data
                return
            elif isinstance(event, (FailedEvent, CancelledEvent)):
                return
    finally:
        if encoder is not None:  # the client left or the run failed: the file stays unfinished
            encoder.close()


def stream_speech_request(speech: Any) -> Any:
    """`speech` with chunked decoding, so its audio leaves as it is decoded."""
    return dataclasses.replace(speech, audio_chunk_codes=STREAM_CHUNK_CODES)
