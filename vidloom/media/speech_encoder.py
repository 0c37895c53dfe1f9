"""Speech encoded while it is spoken: float32 pieces in, the bytes of a speech format out as the muxer writes them.

`pcm` is the pieces' 16-bit samples; `wav` the same after a header whose sizes are unknown (0xFFFFFFFF), as
OpenAI's streamed WAV; mp3, opus (Ogg), aac (ADTS) and flac go through one PyAV encoder and muxer kept open
for the whole utterance, writing to a sink that hands over whatever was written (packets are flushed as
they are muxed; Ogg pages hold OGG_PAGE_US each). Bytes that have left cannot be rewritten, so a streamed
mp3's Xing frame holds the encoder delay but no frame count, and a streamed flac no total length: players
read them to the end, as any live stream.

`speed` != 1 runs ffmpeg's atempo chain over the pieces as they come (media.speech_audio.TimeStretch): atempo
is a streaming filter, and the pieces' output equals the whole waveform's stretch bit for bit
(tests/unit/media/test_speech_encoder.py).
"""

from __future__ import annotations

import struct
import threading
import av
import numpy as np

from vidloom.core.errors import InvalidRequest
from vidloom.media.audio import to_pcm16
from vidloom.media.speech_audio import ENCODERS, TimeStretch, audio_frame, check_format, check_speed

UNKNOWN_SIZE = 0xFFFFFFFF
OGG_PAGE_US = 100_000  # an Ogg page per 0.1 s of Opus (ffmpeg's default, 1 s, would hold the first second back)


def pcm_bytes(samples: np.ndarray) -> bytes:
    return to_pcm16(np.asarray(samples, dtype=np.float32)).astype("<i2").tobytes()


def wav_stream_header(sample_rate: int) -> bytes:
    """A 16-bit mono WAV header whose RIFF and data sizes are unknown (the length is not known yet)."""
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return (b"RIFF" + struct.pack("<I", UNKNOWN_SIZE) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", UNKNOWN_SIZE))


class _Sink:
    """The muxer's file: what it writes waits here until taken, and what was taken is final. It can seek, so
    muxers write their seekable-output headers (mp3's Xing/LAME frame with the encoder delay, which trims
    the priming samples on decode); their closing rewrites of bytes already taken (frame count, flac's
    total length) are dropped, which leaves those fields at "unknown", as in a live stream."""

    def __init__(self) -> None:
        self.pending, self.taken, self.pos = bytearray(), 0, 0

    def write(self, data: bytes) -> int:
        data, start = bytes(data), self.pos
        self.pos += len(data)
        if start < self.taken:  # a rewrite of bytes that have left: keep only what lies past them
            data, start = data[self.taken - start:], self.taken
        offset = start - self.taken
        self.pending[offset:offset + len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        end = self.taken + len(self.pending)
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else end + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def take(self) -> bytes:
        data = bytes(self.pending)
        self.taken += len(data)
        self.pending.clear()
        return data


class SpeechStreamEncoder:
    """Mono float32 pieces in [-1, 1] -> bytes of `fmt` (a speech format) as they become available. Calls are
    serialised by a lock: `close` may come from another thread while a `feed` still runs."""

    def __init__(self, fmt: str, sample_rate: int, speed: float = 1.0) -> None:
        self.fmt, self.sample_rate = check_format(fmt), sample_rate
        self.stretch = TimeStretch(sample_rate, speed) if check_speed(speed) != 1.0 else None
        self.header = fmt == "wav"
        self.container = self.stream = None
        self.pts, self.compressed = 0, fmt in ENCODERS
        self.lock = threading.Lock()
        if self.compressed:
            container_format, codec, bit_rate, rates = ENCODERS[fmt]
            if rates is not None and sample_rate not in rates:
                raise InvalidRequest("response_format",
                                     f"{fmt} cannot encode {sample_rate} Hz audio; use wav, flac or pcm")
            self.sink = _Sink()
            options = {"flush_packets": "1"}
            if container_format == "ogg":
                options["page_duration"] = str(OGG_PAGE_US)
            self.container = av.open(self.sink, mode="w", format=container_format, options=options)
            self.stream = self.container.add_stream(codec, rate=sample_rate, layout="mono")
            if bit_rate is not None:
                self.stream.bit_rate = bit_rate
            self.stream.options = {"threads": "1"}

    def feed(self, samples: np.ndarray) -> bytes:
        mono = np.asarray(samples, dtype=np.float32).reshape(-1)
        with self.lock:
            return self._encode(mono if self.stretch is None else self.stretch.feed(mono))

    def finish(self) -> bytes:
        """The rest of the file (the stretch's last window, the encoder's delayed packets, the trailer)."""
        with self.lock:
            return self._finish()

    def _finish(self) -> bytes:
        data = b"" if self.stretch is None else self._encode(self.stretch.finish())
        if not self.compressed:
            return data + self._encode(np.zeros(0, np.float32))  # an empty wav still gets its header
        if self.container is None:
            raise RuntimeError("the speech encoder was closed or finished already")
        for packet in self.stream.encode(None):
            self.container.mux(packet)
        self.container.close()
        self.container = None
        return data + self.sink.take()

    def close(self) -> None:
        """Drop the encoder without finishing the file (the client left or the run failed)."""
        with self.lock:
            if self.container is not None:
                try:
                    self.container.close()
                except av.error.FFmpegError:
                    pass
                self.container = None

    def _encode(self, mono: np.ndarray) -> bytes:
        if not self.compressed:
            data = pcm_bytes(mono)
            if self.header:
                data, self.header = wav_stream_header(self.sample_rate) + data, False
            return data
        if self.container is None:
            raise RuntimeError("the speech encoder was closed or finished already")
        if mono.size:
            frame = audio_frame(mono, self.stream.codec_context.format.name, self.sample_rate, self.pts)
            self.pts += mono.size
            for packet in self.stream.encode(frame):
                self.container.mux(packet)
        return self.sink.take()
