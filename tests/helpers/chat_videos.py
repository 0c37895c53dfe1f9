"""Small MP4 files for chat video parts: seeded moving noise, with a seeded tone track when asked (AAC)."""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

import numpy as np

from vidloom.media.audio import AudioTrack
from vidloom.media.video import write_video


def video_bytes(seed: int, frames: int = 8, size: tuple[int, int] = (80, 64), fps: int = 4,
                sound: bool = False) -> bytes:
    """An H.264 MP4 of `frames` frames of `size` (width, height) at `fps` (and a 16 kHz tone track)."""
    rng = np.random.RandomState(seed)
    base = rng.rand(size[1], size[0], 3)
    clip = np.stack([np.roll(base, 3 * i, axis=1) for i in range(frames)])
    pixels = (clip * 255).astype(np.uint8)
    audio = None
    if sound:
        t = np.arange(int(16000 * frames / fps)) / 16000
        tones = sum(np.sin(2 * np.pi * f * t) for f in rng.uniform(200, 3000, size=3))
        audio = AudioTrack((0.2 * tones).astype(np.float32)[None], 16000)
    with tempfile.TemporaryDirectory() as folder:
        path = write_video(pixels, fps, Path(folder) / "clip.mp4", audio=audio)
        return path.read_bytes()


def video_part(data: bytes, use_audio: bool | None = None) -> dict:
    """A video_url content part holding `data` as a data: URL."""
    spec: dict = {"url": "data:video/mp4;base64," + base64.b64encode(data).decode()}
    if use_audio is not None:
        spec["use_audio_in_video"] = use_audio
    return {"type": "video_url", "video_url": spec}
