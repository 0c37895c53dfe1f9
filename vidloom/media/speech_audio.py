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
