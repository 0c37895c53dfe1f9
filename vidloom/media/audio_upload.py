"""Uploaded audio files to waveforms, their length checked from the header before decoding: HTTP `init_audio`,
and chat `input_audio` parts (decoded to the audio encoders' 16 kHz mono).

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
from vidloom.media.decode_errors import decode_reason

LIMIT_NAME = "max_init_audio_seconds"  # the server setting (`vidloom serve --max-init-audio-seconds`)
INPUT_AUDIO_FORMATS = ("wav", "mp3")  # OpenAI's input_audio.format values
INPUT_AUDIO_RATE = 16000  # what speech encoders read (Whisper-style features; Qwen2.5-Omni's feature extractor)
# The longest chat audio part decoded, seconds: Qwen2.5-Omni's feature extractor reads at most 300 s (its
# chunk_length); a model may take less (its own window, checked when the prompt is built).
MAX_INPUT_AUDIO_SECONDS = 300.0
INPUT_LIMIT_NAME = "MAX_INPUT_AUDIO_SECONDS"


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


def load_input_audio(data: bytes, fmt: str, field: str, rate: int = INPUT_AUDIO_RATE,
                     max_seconds: float = MAX_INPUT_AUDIO_SECONDS) -> np.ndarray:
    """A chat audio part (the bytes of a wav or mp3 file) as float32 mono [samples] at `rate`, resampled (FFmpeg's
    resampler) and mixed down as it is decoded; InvalidRequest(field) when it is not such a file or lasts longer
    than `max_seconds`."""
    import av

    if fmt not in INPUT_AUDIO_FORMATS:
        raise InvalidRequest(f"{field}.format", f"unsupported format {fmt!r}; supported: {', '.join(INPUT_AUDIO_FORMATS)}")
    if not data:
        raise InvalidRequest(field, "is an empty file")
    with tempfile.TemporaryDirectory(prefix="vidloom-upload-") as folder:
        path = Path(folder) / f"input.{fmt}"
        path.write_bytes(data)
        _check_seconds(_header_seconds(path), field, max_seconds, INPUT_LIMIT_NAME)
        limit = int(max_seconds * rate)
        pieces, total = [], 0
        try:
            with av.open(str(path)) as container:
                if not container.streams.audio:
                    raise InvalidRequest(field, "has no audio stream")
                resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
                for frame in container.decode(audio=0):
                    for out in resampler.resample(frame):
                        pieces.append(out.to_ndarray().reshape(-1))
                        total += pieces[-1].shape[0]
                    _check_seconds(total / rate if total > limit else None, field, max_seconds, INPUT_LIMIT_NAME)
                for out in resampler.resample(None):
                    pieces.append(out.to_ndarray().reshape(-1))
        except (av.error.FFmpegError, OSError, ValueError) as exc:
            raise InvalidRequest(field, f"is not a readable {fmt} file ({decode_reason(exc)})") from None
    samples = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)
    if samples.shape[0] == 0:
        raise InvalidRequest(field, "has no audio samples")
    _check_seconds(samples.shape[0] / rate, field, max_seconds, INPUT_LIMIT_NAME)
    if not np.isfinite(samples).all():
        raise InvalidRequest(field, "holds NaN or infinite samples")
    return samples


def _check_seconds(seconds: float | None, field: str, max_seconds: float, name: str = LIMIT_NAME) -> None:
    if seconds is not None and seconds > max_seconds:
        raise InvalidRequest(field, f"lasts {seconds:.3f} s; this server takes at most {max_seconds:g} s "
                                    f"({name})")


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
