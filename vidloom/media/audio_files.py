"""Audio-only outputs (text-to-audio models) written whole: WAV (16-bit PCM), FLAC, MP3 and Ogg Opus.

Unlike a video's soundtrack (media/audio.py fits it to the video's duration) an audio-only output is written as
long as the model made it. FLAC and WAV keep the model's sample rate; MP3 and Opus only take some rates, so a
waveform at another rate is resampled by the encoder (PyAV/libswresample) to the nearest rate the codec takes
(higher first). Every write is atomic; one encoder thread, so the same samples give the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

from vidloom.core.errors import InvalidRequest
from vidloom.media.atomic import atomic_path
from vidloom.media.audio import LAYOUTS, AudioTrack, read_audio_stream, read_wav, write_wav
from vidloom.media.decode_errors import decode_reason

MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
# extension -> (container, codec, bit rate or None, sample rates the codec takes or None for any)
AUDIO_FILE_CODECS: dict[str, tuple[str, str, int | None, tuple[int, ...] | None]] = {
    ".flac": ("flac", "flac", None, None),
    ".mp3": ("mp3", "libmp3lame", 192_000, MP3_RATES),
    ".ogg": ("ogg", "libopus", 128_000, OPUS_RATES),
}
AUDIO_FILE_FORMATS: dict[str, str] = {
    ".wav": "WAV audio, 16-bit PCM",
    ".flac": "FLAC audio (lossless)",
    ".mp3": "MP3 audio, 192 kb/s",
    ".ogg": "Ogg Opus audio, 128 kb/s",
}
"""What an audio-only output (no frames) can be saved as."""


def open_audio(value: object, field: str, sample_rate: int) -> np.ndarray:
    """A request's input waveform as float32 [channels, samples] (mono or stereo) at `sample_rate`.

    An array (numpy or torch, [samples] or [channels, samples]) is taken to be at that rate already; a path is
    decoded (WAV, FLAC, MP3, Ogg...) and must have that rate. Anything else is InvalidRequest(field).
    """
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        value = value.detach().float().cpu().numpy()
    if isinstance(value, (str, Path)):
        path = Path(value)
        if not path.is_file():
            raise InvalidRequest(field, f"{path}: no such audio file")
        try:
            track = read_wav(path) if path.suffix.lower() == ".wav" else read_audio_stream(path)
        except (ValueError, OSError, av.error.FFmpegError) as exc:
            reason = decode_reason(exc, path)
            raise InvalidRequest(field, f"{path.name}: not a readable audio file ({reason})") from None
        if track.sample_rate != sample_rate:
            raise InvalidRequest(field, f"{path.name} is {track.sample_rate} Hz; this model takes {sample_rate} Hz "
                                        "(resample it first)")
        value = track.samples
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        raise InvalidRequest(field, f"must be a float waveform array or an audio file path, got {type(value).__name__}")
    samples = value[None] if value.ndim == 1 else value
    if samples.ndim != 2 or samples.shape[0] not in LAYOUTS or samples.shape[1] < 1:
        raise InvalidRequest(field, f"must be [samples] or [channels, samples] with 1 or 2 channels, got shape "
                                    f"{tuple(value.shape)}")
    if not np.isfinite(samples).all():
        raise InvalidRequest(field, "holds NaN or infinite samples")
    return np.ascontiguousarray(samples, dtype=np.float32)


def encoder_rate(rate: int, allowed: tuple[int, ...] | None) -> int:
    """`rate` if the codec takes it, else the nearest rate it takes above it (the highest if none is above)."""
    if allowed is None or rate in allowed:
        return rate
    above = [r for r in allowed if r > rate]
    return min(above) if above else max(allowed)


def write_audio_only(track: AudioTrack | None, path: Path, field: str = "output") -> Path:
    """The whole waveform of an audio-only output in the format `path`'s extension names."""
    suffix = path.suffix.lower()
    if suffix not in AUDIO_FILE_FORMATS:
        raise InvalidRequest(field, f"{path.name}: this output is audio only (no frames); use one of "
                                    f"{', '.join(AUDIO_FILE_FORMATS)}")
    if track is None:
        raise InvalidRequest(field, f"{path.name}: this output has neither frames nor audio")
    if suffix == ".wav":
        return write_wav(track, path)
    container_format, codec, bit_rate, rates = AUDIO_FILE_CODECS[suffix]
    samples = np.ascontiguousarray(np.clip(track.samples, -1.0, 1.0), dtype=np.float32)
    layout = LAYOUTS[samples.shape[0]]
    with atomic_path(path) as tmp:
        with av.open(str(tmp), "w", format=container_format) as container:
            stream = container.add_stream(codec, rate=encoder_rate(track.sample_rate, rates), layout=layout)
            if bit_rate is not None:
                stream.bit_rate = bit_rate
            stream.options = {"threads": "1"}
            frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout=layout)
            frame.sample_rate, frame.pts = track.sample_rate, 0
            for packet in stream.encode(frame):
                container.mux(packet)
            for packet in stream.encode(None):
                container.mux(packet)
    return path
