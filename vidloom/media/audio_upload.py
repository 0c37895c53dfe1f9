"""An uploaded audio file (HTTP `init_audio`) to a waveform: its length checked from its header before decoding.

Runs on the server's media pool, never on the event loop. The body limit (max_body_bytes) bounds the file's
bytes; `max_seconds` bounds what it decodes to, so a small, highly compressed file cannot expand into an
arbitrarily long waveform held by a queued job.
"""

from __future__ import annotations

import tempfile
import wave
from pathlib import Path

import numpy as np

from vidloom.core.errors import InvalidRequest
from vidloom.media.audio_files import open_audio

LIMIT_NAME = "max_init_audio_seconds"  # the server setting (`vidloom serve --max-init-audio-seconds`)


def open_audio_upload(data: bytes, field: str, sample_rate: int, max_seconds: float) -> np.ndarray:
    """float32 [channels, samples] at `sample_rate` from an audio file's bytes; InvalidRequest(field) when it is
    not an audio file, has another rate, or lasts longer than `max_seconds`."""
    if not data:
        raise InvalidRequest(field, "is an empty file")
    with tempfile.TemporaryDirectory(prefix="vidloom-upload-") as folder:
        # read_wav handles 16-bit PCM WAV; everything else (FLAC, MP3, Ogg, other WAVs) is probed by FFmpeg.
        path = Path(folder) / (f"{field}.wav" if _is_pcm16_wav(data) else field)
        path.write_bytes(data)
        _check_seconds(_header_seconds(path), field, max_seconds)
        samples = open_audio(path, field, sample_rate)
    _check_seconds(samples.shape[1] / sample_rate, field, max_seconds)  # a header may understate it
    return samples


def _check_seconds(seconds: float | None, field: str, max_seconds: float) -> None:
    if seconds is not None and seconds > max_seconds:
        raise InvalidRequest(field, f"lasts {seconds:.3f} s; this server takes at most {max_seconds:g} s "
                                    f"({LIMIT_NAME})")


def _is_pcm16_wav(data: bytes) -> bool:
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return False
    try:
        with tempfile.SpooledTemporaryFile() as spool:
            spool.write(data[:4096])
            spool.seek(0)
            with wave.open(spool, "rb") as source:
                return source.getsampwidth() == 2
    except (wave.Error, EOFError):
        return False


def _header_seconds(path: Path) -> float | None:
    """The duration a file's header states, or None when it states none (decoding then tells)."""
    if path.suffix == ".wav":
        try:
            with wave.open(str(path), "rb") as source:
                rate = source.getframerate()
                return source.getnframes() / rate if rate > 0 else None
        except (wave.Error, EOFError):
            return None
    import av  # on first use, as media.audio does

    try:
        with av.open(str(path)) as container:
            return None if container.duration is None else container.duration / av.time_base
    except (av.error.FFmpegError, OSError, ValueError):
        return None  # open_audio names the field with the reason
