"""Uploaded audio files to waveforms, each checked against the formats its field takes (media.upload_formats)
and its length checked from the header before decoding: HTTP `init_audio`, and chat `input_audio` parts (decoded
to the audio encoders' 16 kHz mono).

Runs on the server's media pool, never on the event loop. The body limit (max_body_bytes) bounds the file's
bytes; `max_seconds` bounds what it decodes to, so a small, highly compressed file cannot expand into an
arbitrarily long waveform held by a queued job. Files are read from memory (never a temporary file), so no
error can name a server path.
"""

from __future__ import annotations

import io
from typing import Any, Iterator

import numpy as np

from vidloom.core.errors import InvalidRequest
from vidloom.media.audio import decode_audio_stream
from vidloom.media.audio_files import open_audio
from vidloom.media.decode_errors import decode_reason
from vidloom.media.upload_formats import (INIT_AUDIO, INPUT_AUDIO, MediaFormat, check_codec, declared_format,
                                          sniffed_format)

LIMIT_NAME = "max_init_audio_seconds"  # the server setting (`vidloom serve --max-init-audio-seconds`)
INPUT_AUDIO_FORMATS = tuple(INPUT_AUDIO)  # OpenAI's input_audio.format values
INPUT_AUDIO_RATE = 16000  # what speech encoders read (Whisper-style features; Qwen2.5-Omni's feature extractor)
# The longest chat audio part decoded, seconds: Qwen2.5-Omni's feature extractor reads at most 300 s (its
# chunk_length); a model may take less (its own window, checked when the prompt is built).
MAX_INPUT_AUDIO_SECONDS = 300.0
INPUT_LIMIT_NAME = "MAX_INPUT_AUDIO_SECONDS"


def open_audio_upload(data: bytes, field: str, sample_rate: int, max_seconds: float) -> np.ndarray:
    """float32 [channels, samples] at `sample_rate` from an audio file's bytes (WAV, FLAC, MP3 or Ogg);
    InvalidRequest(field) when it is none of those, has another rate, or lasts longer than `max_seconds`."""
    import av

    if not data:
        raise InvalidRequest(field, "is an empty file")
    fmt = sniffed_format(data, field, INIT_AUDIO, "audio file")
    with _opened(data, fmt, field) as (container, stream):
        _check_seconds(_header_seconds(container), field, max_seconds, header=True)
        try:
            track = decode_audio_stream(container, stream)
        except (av.error.FFmpegError, OSError, ValueError) as exc:
            raise InvalidRequest(field, f"is not a readable {fmt.name} file ({decode_reason(exc)})") from None
    _check_seconds(track.samples.shape[1] / track.sample_rate, field, max_seconds)  # a header may understate it
    if track.sample_rate != sample_rate:
        raise InvalidRequest(field, f"is {track.sample_rate} Hz; this model takes {sample_rate} Hz (resample it "
                                    "first)")
    return open_audio(track.samples, field, sample_rate)


def input_audio_seconds(data: bytes, fmt: str, field: str) -> float | None:
    """How long a chat audio part's header says it lasts (None: it says nothing), read without decoding;
    InvalidRequest(field) when it is not a `fmt` file (as load_input_audio)."""
    with _opened(data, _input_format(data, fmt, field), field) as (container, _):
        return _header_seconds(container)


def load_input_audio(data: bytes, fmt: str, field: str, rate: int = INPUT_AUDIO_RATE,
                     max_seconds: float = MAX_INPUT_AUDIO_SECONDS) -> np.ndarray:
    """A chat audio part (the bytes of a wav or mp3 file, as `fmt` declares) as float32 mono [samples] at `rate`,
    resampled (FFmpeg's resampler) and mixed down as it is decoded; InvalidRequest(field) when it is not such a
    file or lasts longer than `max_seconds`."""
    limit = int(max_seconds * rate)
    pieces, total = [], 0
    with _opened(data, _input_format(data, fmt, field), field) as (container, stream):
        _check_seconds(_header_seconds(container), field, max_seconds, INPUT_LIMIT_NAME, header=True)
        for piece in _resampled(container, stream, rate, field, fmt):
            pieces.append(piece)
            total += piece.shape[0]
            _check_seconds(total / rate if total > limit else None, field, max_seconds, INPUT_LIMIT_NAME)
    return joined_samples(pieces, field)


def joined_samples(pieces: list[np.ndarray], field: str) -> np.ndarray:
    """Decoded pieces as one float32 waveform; InvalidRequest(field) when it is empty or not finite."""
    samples = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)
    if samples.shape[0] == 0:
        raise InvalidRequest(field, "has no audio samples")
    if not np.isfinite(samples).all():
        raise InvalidRequest(field, "holds NaN or infinite samples")
    return samples


def _resampled(container: Any, stream: Any, rate: int, field: str, fmt: str) -> Iterator[np.ndarray]:
    """The stream decoded, mixed to mono and resampled to `rate`, piece by piece; FFmpeg's failures (only those:
    the caller's refusals keep their own words) are InvalidRequest(field)."""
    import av

    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    try:
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                yield out.to_ndarray().reshape(-1)
        for out in resampler.resample(None):
            yield out.to_ndarray().reshape(-1)
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise InvalidRequest(field, f"is not a readable {fmt} file ({decode_reason(exc)})") from None


def _input_format(data: bytes, fmt: str, field: str) -> MediaFormat:
    if fmt not in INPUT_AUDIO:
        raise InvalidRequest(f"{field}.format", f"unsupported format {fmt!r}; supported: {', '.join(INPUT_AUDIO)}")
    if not data:
        raise InvalidRequest(field, "is an empty file")
    return declared_format(data, fmt, field)


class _opened:
    """`with _opened(data, fmt, field) as (container, stream)`: the bytes opened with `fmt`'s demuxer alone, its
    first audio stream checked against `fmt`'s codecs; InvalidRequest(field) when FFmpeg cannot read it as that."""

    def __init__(self, data: bytes, fmt: MediaFormat, field: str) -> None:
        self.data, self.fmt, self.field = data, fmt, field
        self.container: Any = None

    def __enter__(self) -> tuple[Any, Any]:
        import av

        try:
            self.container = av.open(io.BytesIO(self.data), format=self.fmt.demuxer)
        except (av.error.FFmpegError, OSError, ValueError) as exc:
            raise InvalidRequest(self.field, f"is not a readable {self.fmt.name} file ({decode_reason(exc)})") \
                from None
        try:
            if not self.container.streams.audio:
                raise InvalidRequest(self.field, "has no audio stream")
            stream = self.container.streams.audio[0]
            check_codec(stream, self.fmt, self.field)
        except BaseException:
            self.container.close()
            raise
        return self.container, stream

    def __exit__(self, *exc: object) -> None:
        self.container.close()


def _check_seconds(seconds: float | None, field: str, max_seconds: float, name: str = LIMIT_NAME,
                   header: bool = False) -> None:
    if seconds is not None and seconds > max_seconds:
        said = "its header says it lasts" if header else "lasts"
        raise InvalidRequest(field, f"{said} {seconds:.3f} s; this server takes at most {max_seconds:g} s ({name})")


def _header_seconds(container: Any) -> float | None:
    """The duration the container's header states, or None when it states none (decoding then tells)."""
    import av

    return None if container.duration is None else container.duration / av.time_base
