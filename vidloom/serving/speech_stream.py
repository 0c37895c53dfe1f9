"""Speech that streams while the talker decodes: audio chunks (AudioChunkEvents of a request with
`audio_chunk_codes`) turned into bytes of a stream as they arrive.

Raw PCM and WAV can be written a piece at a time (a WAV stream's header gives its sizes as unknown,
0xFFFFFFFF, as streamed WAV from OpenAI's API does); a compressed format, or a `speed` that
stretches the whole waveform, is encoded once the request is done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
from typing import Any, AsyncIterator

import numpy as np

from vidloom.core.output import AudioChunkEvent, CancelledEvent, CompletedEvent, Event, FailedEvent
from vidloom.media.audio import to_pcm16

STREAM_CHUNK_CODES = 25  # codes per streamed chunk: 0.5 s of speech at Qwen2.5-Omni's 50 codes/s
PROGRESSIVE_FORMATS = ("pcm", "wav")
UNKNOWN_SIZE = 0xFFFFFFFF


def streams_progressively(fmt: str, speed: float = 1.0) -> bool:
    """Whether `fmt` audio can leave chunk by chunk (else it is encoded from the whole waveform)."""
    return fmt in PROGRESSIVE_FORMATS and speed == 1.0


def wav_stream_header(sample_rate: int) -> bytes:
    """A 16-bit mono WAV header whose RIFF and data sizes are unknown (the length is not known yet)."""
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return (b"RIFF" + struct.pack("<I", UNKNOWN_SIZE) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", UNKNOWN_SIZE))


def pcm_bytes(samples: np.ndarray) -> bytes:
    return to_pcm16(np.asarray(samples, dtype=np.float32)).astype("<i2").tobytes()


async def streamed_bytes(queue: asyncio.Queue[Event], fmt: str) -> AsyncIterator[bytes]:
    """The request's audio as `fmt` bytes, one piece per chunk as it is decoded, until its run ends (the
    caller then awaits the run's result, which raises if it failed)."""
    header = fmt == "wav"
    while True:
        event = await queue.get()
        if isinstance(event, AudioChunkEvent):
            data = pcm_bytes(event.audio)
            if header:
                data, header = wav_stream_header(event.sample_rate) + data, False
            if data:
                yield data
        elif isinstance(event, (CompletedEvent, FailedEvent, CancelledEvent)):
            return


def stream_speech_request(speech: Any, fmt: str, speed: float = 1.0) -> Any:
    """`speech` with chunked decoding when its audio can leave as it is decoded."""
    if not streams_progressively(fmt, speed):
        return speech
    return dataclasses.replace(speech, audio_chunk_codes=STREAM_CHUNK_CODES)
