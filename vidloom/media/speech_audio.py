"""Encode a mono speech waveform as the bytes of one of OpenAI's speech formats (mp3, opus, aac, flac, wav, pcm).

`pcm` is raw 16-bit signed little-endian samples at the model's rate (no header), as OpenAI defines it; `wav`
is 16-bit PCM WAV; the compressed ones are encoded by PyAV in memory (MP3 via LAME, Opus in Ogg, AAC in ADTS,
FLAC). Constant bit rate and one thread, so the same samples give the same bytes.
"""

from __future__ import annotations

import io
import wave
from fractions import Fraction

import av
import av.filter
import numpy as np

from vidloom.core.errors import InvalidRequest
from vidloom.media.audio import to_pcm16

SPEECH_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav", "pcm": "audio/pcm"}
# format -> (container, codec, bit rate or None, sample rates the codec takes; None: any)
ENCODERS: dict[str, tuple[str, str, int | None, tuple[int, ...] | None]] = {
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
    container_format, codec, bit_rate, rates = ENCODERS[fmt]
    if rates is not None and sample_rate not in rates:
        raise InvalidRequest("response_format", f"{fmt} cannot encode {sample_rate} Hz audio; use wav, flac or pcm")
    out = io.BytesIO()
    with av.open(out, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=sample_rate, layout="mono")
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        stream.options = {"threads": "1"}
        frame = audio_frame(mono, stream.codec_context.format.name, sample_rate, 0)
        if mono.size:
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def audio_frame(mono: np.ndarray, fmt_name: str, sample_rate: int, pts: int) -> av.AudioFrame:
    """A mono frame of float32 samples in the encoder's sample format (s16, flt/fltp, else fltp to convert)."""
    data = np.clip(mono, -1.0, 1.0)
    if fmt_name == "s16":
        frame = av.AudioFrame.from_ndarray(to_pcm16(data)[None], format="s16", layout="mono")
    else:  # flt / fltp as they are; e.g. s16p / s32p converted by PyAV from fltp
        frame = av.AudioFrame.from_ndarray(data[None].copy(), format=fmt_name if fmt_name in ("flt", "fltp")
                                           else "fltp", layout="mono")
    frame.sample_rate, frame.pts = sample_rate, pts
    return frame


def wav_bytes(mono: np.ndarray, sample_rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(to_pcm16(mono).astype("<i2").tobytes())
    return out.getvalue()


MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's speech speed range
ATEMPO_RANGE = (0.5, 2.0)  # one ffmpeg atempo filter's range; wider factors chain several
STRETCH_FLUSH_S = 0.2  # trailing silence that pushes atempo's last window out
STRETCH_FRAME = 1024  # samples per frame pushed into atempo (43 ms at 24 kHz)


def check_speed(speed: object, field: str = "speed") -> float:
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise InvalidRequest(field, f"must be a number from {MIN_SPEED} to {MAX_SPEED}, got {speed!r}")
    return float(speed)


def time_stretch(samples: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """Play `speed` times faster without changing the pitch (ffmpeg's atempo, WSOLA), via PyAV's filter graph."""
    original = np.asarray(samples, dtype=np.float32).reshape(-1)
    if check_speed(speed) == 1.0 or original.size == 0:
        return original
    stretch = TimeStretch(sample_rate, speed)
    return np.concatenate([stretch.feed(original), stretch.finish()])


class TimeStretch:
    """Play `speed` times faster without changing the pitch: ffmpeg's atempo (WSOLA) fed piece by piece."""

    def __init__(self, sample_rate: int, speed: float) -> None:
        self.sample_rate, self.speed = sample_rate, check_speed(speed)
        self.fed = self.emitted = 0
        factors, rest = [], self.speed
        while rest > ATEMPO_RANGE[1]:
            factors.append(ATEMPO_RANGE[1])
            rest /= ATEMPO_RANGE[1]
        while rest < ATEMPO_RANGE[0]:
            factors.append(ATEMPO_RANGE[0])
            rest /= ATEMPO_RANGE[0]
        factors.append(rest)
        self.graph = av.filter.Graph()
        nodes = [self.graph.add_abuffer(format="flt", sample_rate=sample_rate, layout="mono",
                                        time_base=Fraction(1, sample_rate))]
        nodes += [self.graph.add("atempo", f"{factor}") for factor in factors]
        nodes.append(self.graph.add("abuffersink"))
        for upstream, downstream in zip(nodes, nodes[1:]):
            upstream.link_to(downstream)
        self.graph.configure()

    def _push(self, samples: np.ndarray | None) -> np.ndarray:
        out: list[np.ndarray] = []
        # atempo emits an output frame once it has filled one the size of its input frame: small input frames
        # keep what it holds back small
        pieces = [None] if samples is None else [samples[i:i + STRETCH_FRAME] for i in range(0, samples.size,
                                                                                            STRETCH_FRAME)]
        for piece in pieces:
            if piece is None:
                self.graph.push(None)
            else:
                frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(piece[None]), format="flt", layout="mono")
                frame.sample_rate, frame.time_base = self.sample_rate, Fraction(1, self.sample_rate)
                frame.pts = self.fed
                self.graph.push(frame)
                self.fed += piece.size
            while True:
                try:
                    out.append(self.graph.pull().to_ndarray().reshape(-1))
                except (av.error.BlockingIOError, av.error.EOFError, EOFError):
                    break
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, dtype=np.float32)

    def feed(self, samples: np.ndarray) -> np.ndarray:
        """The stretched samples these complete (atempo holds its last window back until more arrive)."""
        out = self._push(np.asarray(samples, dtype=np.float32).reshape(-1))
        self.emitted += out.size
        return out

    def finish(self) -> np.ndarray:
        """The rest, cut (or padded) so that everything emitted is round(fed / speed) samples."""
        spoken = self.fed
        out = self._push(np.zeros(int(self.sample_rate * STRETCH_FLUSH_S), np.float32))
        out = np.concatenate([out, self._push(None)])
        rest = max(0, round(spoken / self.speed) - self.emitted)
        out = np.pad(out[:rest], (0, max(0, rest - out.size)))
        self.emitted += out.size
        return out
