"""WAV files for audio inputs (chat parts, uploads), written in memory."""

from __future__ import annotations

import io
import wave

import numpy as np


def pcm16_wav(pcm: np.ndarray, rate: int) -> bytes:
    """A WAV file of 16-bit PCM samples: `pcm` is [T] (mono) or [T, C] (interleaved channels)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1 if pcm.ndim == 1 else pcm.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return out.getvalue()
