"""Speech encoded piece by piece (media.speech_encoder): bytes leave before the end, the file decodes to the
whole encode's duration within a codec frame, and the streamed time stretch is the whole one's."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from vidloom.media.speech_audio import TimeStretch, encode_speech, time_stretch
from vidloom.media.speech_encoder import SpeechStreamEncoder

RATE = 24000
FRAME_S = {"mp3": 1152 / RATE, "opus": 0.02, "aac": 1024 / RATE, "flac": 0.0, "wav": 0.0}  # one codec frame


def speech_like(seconds: float = 2.5) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    rng = np.random.default_rng(0)
    wave = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(t.size)
    return wave.astype(np.float32)


def pieces_of(samples: np.ndarray, sizes=(12000, 24000, 7001)) -> list[np.ndarray]:
    out, start, k = [], 0, 0
    while start < samples.size:
        out.append(samples[start:start + sizes[k % len(sizes)]])
        start, k = start + sizes[k % len(sizes)], k + 1
    return out


def decoded_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(container.streams.audio[0]))
    return sum(f.samples for f in frames) / frames[0].sample_rate


@pytest.mark.parametrize("speed", [0.25, 0.7, 2.5])
def test_streamed_stretch_is_the_whole_stretch(speed):
    wave = speech_like()
    stretch = TimeStretch(RATE, speed)
    parts = [stretch.feed(piece) for piece in pieces_of(wave)] + [stretch.finish()]
    assert sum(p.size for p in parts[:-1]) > 0  # it emits while fed, not only at the end
    np.testing.assert_array_equal(np.concatenate(parts), time_stretch(wave, RATE, speed))  # bit for bit
    assert sum(p.size for p in parts) == round(wave.size / speed)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
@pytest.mark.parametrize("speed", [1.0, 1.5])
def test_every_format_streams_and_decodes_to_the_whole_duration(fmt, speed):
    wave = speech_like()
    encoder = SpeechStreamEncoder(fmt, RATE, speed)
    fed = [encoder.feed(piece) for piece in pieces_of(wave)]
    data = b"".join(fed) + encoder.finish()
    assert len(fed[0]) > 0 or len(fed[1]) > 0  # bytes leave after the first half second or so
    assert sum(len(b) for b in fed) > len(data) // 2  # most of the file before the end
    whole = encode_speech(time_stretch(wave, RATE, speed), RATE, fmt)
    assert abs(decoded_seconds(data) - decoded_seconds(whole)) <= FRAME_S[fmt] + 1e-9


def test_pcm_and_wav_pieces_are_the_samples():
    wave = speech_like(0.5)
    pcm = SpeechStreamEncoder("pcm", RATE)
    assert b"".join(pcm.feed(p) for p in pieces_of(wave, (1000,))) + pcm.finish() == encode_speech(wave, RATE, "pcm")
    wav = SpeechStreamEncoder("wav", RATE)
    data = b"".join(wav.feed(p) for p in pieces_of(wave, (1000,))) + wav.finish()
    assert data[:4] == b"RIFF" and data[4:8] == b"\xff\xff\xff\xff"  # sizes unknown while streaming
    assert data[44:] == encode_speech(wave, RATE, "pcm")


def test_a_closed_encoder_refuses_more():
    encoder = SpeechStreamEncoder("mp3", RATE)
    encoder.feed(speech_like(0.2))
    encoder.close()
    with pytest.raises(RuntimeError, match="closed"):
        encoder.feed(speech_like(0.2))
