"""Encode a mono speech waveform as the bytes of one of OpenAI's speech formats (mp3, opus, aac, flac, wav, pcm).

`pcm` is raw 16-bit signed little-endian samples at the model's rate (no header), as OpenAI defines it; `wav`
is 16-bit PCM WAV; the compressed ones are encoded by PyAV in memory (MP3 via LAME, Opus in Ogg, AAC in ADTS,
FLAC). Constant bit rate and one thread, so the same samples give the same bytes.
"""

from __future__ import annotations

import io
import wave

import av
import numpy as np

from vidloom.core.errors import InvalidRequest
from vidloom.media.audio import to_pcm16

SPEECH_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav", "pcm": "audio/pcm"}
# format -> (container, codec, bit rate or None, sample rates the codec takes; None: any)
_ENCODERS: dict[str, tuple[str, str, int | None, tuple[int, ...] | None]] = {
    "mp3": ("mp3", "libmp3lame", 128_000, (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "opus": ("ogg", "libopus", 64_000, (8000, 12000, 16000, 24000, 48000)),
    "aac": ("adts", "aac", 128_000, (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "flac": ("flac", "flac", None, None),
}


def check_format(fmt: object, field: str = "response_format") -> str:
    if fmt not in SPEECH_FORMATS:
        raise InvalidRequest(field, f"unsupported format {fmt!r}; supported: {', '.join(SPEECH_FORMATS)}")
    return str(fmt)


def encode_speech(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Mono float32 samples in [-1, 1] -> the file bytes of `fmt`."""
    check_format(fmt)
    mono = np.asarray(samples, dtype=np.float32).reshape(-1)
    if fmt == "pcm":
        return to_pcm16(mono).astype("<i2").tobytes()
    if fmt == "wav":
        return wav_bytes(mono, sample_rate)
    container_format, codec, bit_rate, rates = _ENCODERS[fmt]
    if rates is not None and sample_rate not in rates:
        raise InvalidRequest("response_format", f"{fmt} cannot encode {sample_rate} Hz audio; use wav, flac or pcm")
    out = io.BytesIO()
    with av.open(out, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=sample_rate, layout="mono")
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        stream.options = {"threads": "1"}
        fmt_name = stream.codec_context.format.name
        data = np.clip(mono, -1.0, 1.0)
        if fmt_name == "s16":
            frame = av.AudioFrame.from_ndarray(to_pcm16(data)[None], format="s16", layout="mono")
        elif fmt_name in ("flt", "fltp"):
            frame = av.AudioFrame.from_ndarray(data[None].copy(), format=fmt_name, layout="mono")
        else:  # e.g. s16p / s32
            frame = av.AudioFrame.from_ndarray(data[None].copy(), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = sample_rate, 0
        if mono.size:
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def wav_bytes(mono: np.ndarray, sample_rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(to_pcm16(mono).astype("<i2").tobytes())
    return out.getvalue()


MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's speech speed range
_ATEMPO_RANGE = (0.5, 2.0)  # one ffmpeg atempo filter's range; wider factors chain several


def check_speed(speed: object, field: str = "speed") -> float:
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise InvalidRequest(field, f"must be a number from {MIN_SPEED} to {MAX_SPEED}, got {speed!r}")
    return float(speed)


def time_stretch(samples: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """Play `speed` times faster without changing the pitch (ffmpeg's atempo, WSOLA), via PyAV's filter graph."""
    import av.filter
    from fractions import Fraction

    speed = check_speed(speed)
    original = np.asarray(samples, dtype=np.float32).reshape(-1)
    if speed == 1.0 or original.size == 0:
        return original
    # atempo works in windows of tens of milliseconds and holds the last one back: trailing silence flushes it,
    # then the result is cut to the stretched length.
    target = round(original.size / speed)
    mono = np.ascontiguousarray(np.concatenate([original, np.zeros(sample_rate // 5, np.float32)])[None])
    factors, rest = [], speed
    while rest > _ATEMPO_RANGE[1]:
        factors.append(_ATEMPO_RANGE[1])
        rest /= _ATEMPO_RANGE[1]
    while rest < _ATEMPO_RANGE[0]:
        factors.append(_ATEMPO_RANGE[0])
        rest /= _ATEMPO_RANGE[0]
    factors.append(rest)
    graph = av.filter.Graph()
    nodes = [graph.add_abuffer(format="flt", sample_rate=sample_rate, layout="mono", time_base=Fraction(1, sample_rate))]
    nodes += [graph.add("atempo", f"{factor}") for factor in factors]
    nodes.append(graph.add("abuffersink"))
    for upstream, downstream in zip(nodes, nodes[1:]):
        upstream.link_to(downstream)
    graph.configure()
    frame = av.AudioFrame.from_ndarray(mono, format="flt", layout="mono")
    frame.sample_rate, frame.pts, frame.time_base = sample_rate, 0, Fraction(1, sample_rate)
    graph.push(frame)
    graph.push(None)
    out = []
    while True:
        try:
            out.append(graph.pull().to_ndarray().reshape(-1))
        except (av.error.BlockingIOError, av.error.EOFError, EOFError):
            break
    stretched = np.concatenate(out).astype(np.float32) if out else np.zeros(0, dtype=np.float32)
    return np.pad(stretched[:target], (0, max(0, target - stretched.size)))
