"""What a request asks the model to produce; its own module so the request and its checks share it."""

from __future__ import annotations

from enum import Enum


class Task(str, Enum):
    """What a request asks the model to produce (and from what)."""

    T2V = "t2v"  # text -> video
    I2V = "i2v"  # image (+ text) -> video
    T2I = "t2i"  # text -> image
    V2V = "v2v"  # video (+ text) -> video
    T2A = "t2a"  # text -> audio, no frames (audio-only cards: ModelCard.audio)
