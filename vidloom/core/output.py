"""Results and events: what a run produces and what it reports while running."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:
    from vidloom.core.session import VideoSession


@dataclass(frozen=True)
class VideoOutput:
    """Decoded frames (uint8, frames x H x W x 3), their rate, and run metadata."""

    frames: np.ndarray
    fps: int
    metadata: dict[str, Any] = field(default_factory=dict)
    session: VideoSession | None = field(default=None, repr=False)
    """Causal models: what `generate(extend_from=this output)` continues from (None on other models)."""

    def __post_init__(self) -> None:
        f = self.frames
        if f.dtype != np.uint8 or f.ndim != 4 or f.shape[-1] != 3:
            raise ValueError(f"frames must be uint8 [F, H, W, 3], got {f.dtype} {f.shape}")

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    def save(self, path: str | Path) -> Path:
        """Write by extension: .mp4 (H.264), .webm (VP9), .gif, .png (one frame, else out_0000.png ...),
        .jpg / .webp (one frame: image models).

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
class VideoChunk:
    """Consecutive frames of a video that is still being generated (a decoded chunk of a causal rollout)."""

    index: int  # 0-based chunk index
    total: int  # chunks the video will have
    start_frame: int  # index of `frames[0]` in the whole video
    frames: np.ndarray  # float32 [F, H, W, 3] in [0, 1] from the loop; uint8 in ChunkEvent

    @property
    def stop_frame(self) -> int:
        return self.start_frame + int(self.frames.shape[0])


@dataclass(frozen=True)
class ChunkEvent:
    """A chunk of the output is ready before the request completes; the chunks, in order, are the video."""

    request_id: str
    chunk: VideoChunk  # frames as uint8 [F, H, W, 3]
    fps: int

    def seconds(self) -> tuple[float, float]:
        """The chunk's time range in the video."""
        return self.chunk.start_frame / self.fps, self.chunk.stop_frame / self.fps


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


Event = StartedEvent | ProgressEvent | ChunkEvent | CompletedEvent | FailedEvent | CancelledEvent
EventCallback = Callable[[Event], None]
