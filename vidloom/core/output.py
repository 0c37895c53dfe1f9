"""Results and events: what a run produces and what it reports while running."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:
    from vidloom.core.session import VideoSession


MAX_AUDIO_CHANNELS = 2
"""Channels an output's audio may have (mono or stereo: what AAC/Opus and WAV writers lay out by name)."""


@dataclass(frozen=True)
class VideoOutput:
    """Decoded frames (uint8, frames x H x W x 3), their rate, run metadata, and, for models that make
    sound, the waveform (float32, channels x samples, nominally in [-1, 1]) with its sample rate.

    `audio` and `sample_rate` come together or not at all; every audio-producing family uses these names.
    A float32 torch tensor is accepted for `audio` and stored as a numpy array.
    """

    frames: np.ndarray
    fps: int
    metadata: dict[str, Any] = field(default_factory=dict)
    audio: np.ndarray | None = None
    sample_rate: int | None = None
    session: VideoSession | None = field(default=None, repr=False)
    """Causal models: what `generate(extend_from=this output)` continues from (None on other models)."""
    actions: np.ndarray | None = field(default=None, repr=False)
    """World models (an `action` block in policy or inverse_dynamics mode): the predicted actions, float32
    [chunk_size, D] at the embodiment's width; None otherwise."""
    writer: Callable[[VideoOutput, Path], Path] | None = field(default=None, repr=False, compare=False)
    """What `save` encodes with: injected by whoever builds the output (the runtime: media.output.save_output),
    because encoding lives in `media`, a layer above core."""

    def __post_init__(self) -> None:
        f = self.frames
        if f.dtype != np.uint8 or f.ndim != 4 or f.shape[-1] != 3:
            raise ValueError(f"frames must be uint8 [F, H, W, 3], got {f.dtype} {f.shape}")
        if (self.audio is None) != (self.sample_rate is None):
            given = "audio" if self.sample_rate is None else "sample_rate"
            raise ValueError(f"audio and sample_rate come together: {given} was given without the other")
        if self.audio is not None:
            object.__setattr__(self, "audio", checked_audio(self.audio))
            object.__setattr__(self, "sample_rate", checked_sample_rate(self.sample_rate))

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    @property
    def duration_s(self) -> float:
        """The video's length in seconds; written audio is fitted to it (media/audio.py). An audio-only
        output (no frames) lasts as long as its waveform."""
        if self.num_frames == 0 and self.audio is not None and self.sample_rate:
            return self.audio.shape[1] / self.sample_rate
        return self.num_frames / self.fps

    def save(self, path: str | Path) -> Path:
        """Write by extension: .mp4 (H.264, plus AAC sound when the output has audio), .webm (VP9, Opus sound),
        .gif, .png (one frame, else out_0000.png ...), .jpg / .webp (one frame: image models), .wav (the
        audio alone, 16-bit PCM). Written audio lasts exactly as long as the video (trimmed or padded with
        silence); gif/png/jpg/webp carry no sound. An audio-only output (no frames: text-to-audio models) is
        written whole as .wav, .flac, .mp3 or .ogg (Opus).

        Returns the path written (the first file of a PNG sequence); another extension, .wav for an
        output without audio, or a directory that does not exist raises InvalidRequest("output") before
        anything is encoded. The encoding is the `writer` the runtime attached (vidloom.media.output.save_output);
        an output built without one says so.
        """
        if self.writer is None:
            raise RuntimeError("this VideoOutput has no writer; write it with vidloom.media.output.save_output")
        return self.writer(self, Path(path))


def checked_sample_rate(rate: Any) -> int:
    """A positive integer number of Hz (numpy integers accepted), as int; ValueError otherwise."""
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate < 1:
        raise ValueError(f"sample_rate must be a positive integer (Hz), got {rate!r}")
    return int(rate)


def checked_audio(audio: Any) -> np.ndarray:
    """float32 [channels, samples], finite, as a numpy array; ValueError naming what is wrong otherwise."""
    if hasattr(audio, "detach") and hasattr(audio, "cpu"):  # a torch tensor, without importing torch here
        if str(audio.dtype) != "torch.float32":
            raise ValueError(f"audio must be float32, got {audio.dtype}")
        audio = audio.detach().cpu().numpy()
    if not isinstance(audio, np.ndarray):
        raise ValueError(f"audio must be a float32 array [channels, samples], got {type(audio).__name__}")
    if audio.dtype != np.float32:
        raise ValueError(f"audio must be float32, got {audio.dtype}")
    if audio.ndim != 2 or not 1 <= audio.shape[0] <= MAX_AUDIO_CHANNELS or audio.shape[1] < 1:
        raise ValueError(f"audio must be [channels, samples] with 1..{MAX_AUDIO_CHANNELS} channels and at least "
                         f"one sample, got shape {audio.shape}")
    if not np.isfinite(audio).all():
        raise ValueError(f"audio has {int(np.size(audio) - np.isfinite(audio).sum())} non-finite samples (NaN/inf)")
    return audio


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
class TextEvent:
    """Text a phase wrote, as it is decoded (a chat answer, a unified model's reasoning before it generates); the
    events of a phase, in order, are its whole text."""

    request_id: str
    phase: str
    text: str  # may be "" while a multi-byte character or a stop string is pending
    token_ids: tuple[int, ...] = ()  # the tokens decoded in this step (an AR loop's)


@dataclass(frozen=True)
class AudioChunkEvent:
    """Speech samples ready before the request completes (a streamed speech request's); the chunks of a
    request, in order, are its waveform."""

    request_id: str
    index: int  # 0-based chunk index
    start_sample: int  # index of `audio[0]` in the whole waveform
    audio: np.ndarray  # float32 [samples] in [-1, 1]
    sample_rate: int


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


Event = StartedEvent | ProgressEvent | ChunkEvent | AudioChunkEvent | TextEvent | CompletedEvent | FailedEvent | CancelledEvent
EventCallback = Callable[[Event], None]
