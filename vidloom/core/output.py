"""Results and events: what a run produces and what it reports while running."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class VideoOutput:
    """Decoded frames (uint8, frames x H x W x 3), their rate, and run metadata."""

    frames: np.ndarray
    fps: int
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        f = self.frames
        if f.dtype != np.uint8 or f.ndim != 4 or f.shape[-1] != 3:
            raise ValueError(f"frames must be uint8 [F, H, W, 3], got {f.dtype} {f.shape}")

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    def save(self, path: str | Path) -> Path:
        """Write by extension: .mp4 (H.264), .webm (VP9), .gif, .png (one frame, else out_0000.png ...).

        Returns the path written (the first file of a PNG sequence); another extension raises
        InvalidRequest("output") before anything is encoded.
        """
        from vidloom.media.output import write_output

        return write_output(self.frames, self.fps, Path(path))[0]


@dataclass(frozen=True)
class ProgressEvent:
    """A step of some phase finished: `phase` is a loop name or e.g. "decode"."""

    request_id: str
    phase: str
    step: int  # steps done so far in this phase (1-based after the first step)
    total: int
    seconds: float = 0.0  # wall time of this step


@dataclass(frozen=True)
class StartedEvent:
    """The request left the queue and holds a slot."""

    request_id: str


@dataclass(frozen=True)
class CompletedEvent:
    request_id: str
    output: VideoOutput


@dataclass(frozen=True)
class FailedEvent:
    request_id: str
    code: str  # machine-readable: invalid_request | non_finite_output | internal_error | ...
    message: str


@dataclass(frozen=True)
class CancelledEvent:
    request_id: str


Event = StartedEvent | ProgressEvent | CompletedEvent | FailedEvent | CancelledEvent
EventCallback = Callable[[Event], None]
