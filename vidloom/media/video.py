"""Encode frames to MP4 (H.264 via PyAV) and PNG; every write is atomic."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import av
import numpy as np
import torch


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it over `path` only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] -> uint8, rounding to nearest (half to even); uint8 frames pass through."""
    if frames.dtype == np.uint8:
        return frames
    return (np.clip(frames, 0.0, 1.0) * 255.0).round().astype(np.uint8)


def frames_to_uint8(frames: torch.Tensor) -> torch.Tensor:
    """`to_uint8` on a float32 tensor where it lives (e.g. on the GPU, before a 4x smaller host copy):
    the same float32 clamp, scale and half-to-even rounding, so the same bytes."""
    return (frames.float().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).contiguous()


def write_video(frames: np.ndarray, fps: int, path: Path, crf: int = 18) -> Path:
    """Write uint8 frames [F, H, W, 3] as H.264 MP4 (yuv420p, so H and W must be even)."""
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [F, H, W, 3], got {frames.dtype} {frames.shape}")
    _, height, width, _ = frames.shape
    if height % 2 or width % 2:
        raise ValueError(f"H.264 needs even sizes, got {width}x{height}")
    with atomic_path(path) as tmp:
        with av.open(str(tmp), mode="w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=fps)
            stream.width, stream.height = width, height
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": str(crf)}
            for frame in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
    return path


def write_png(frame: np.ndarray, path: Path) -> Path:
    """Write one uint8 [H, W, 3] frame as PNG."""
    with atomic_path(path) as tmp:
        with av.open(str(tmp), mode="w", format="image2") as container:
            stream = container.add_stream("png")
            stream.width, stream.height = frame.shape[1], frame.shape[0]
            stream.pix_fmt = "rgb24"
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
    return path


def encode_png(frame: np.ndarray) -> bytes:
    """One uint8 [H, W, 3] frame as PNG bytes, in memory (for HTTP answers that never touch disk)."""
    codec = av.CodecContext.create("png", "w")
    codec.width, codec.height = frame.shape[1], frame.shape[0]
    codec.pix_fmt = "rgb24"
    packets = [*codec.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")), *codec.encode(None)]
    return b"".join(bytes(packet) for packet in packets)


def read_video(path: Path) -> tuple[np.ndarray, float]:
    """Decode an MP4 back to uint8 frames [F, H, W, 3] and its frame rate."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        fps = float(stream.average_rate) if stream.average_rate else 0.0
    return np.stack(frames), fps
