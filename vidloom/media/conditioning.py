"""Conditioning inputs: an I2V frame fitted to the video size, a V2V context clip as a uint8 RGB array."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vidloom.core.errors import InvalidRequest


def fit_image(image: Any, size: tuple[int, int]) -> Any:
    """`image` (an RGB PIL image) at `size` (width, height), resized with Lanczos (diffusers' default
    for PIL inputs) when it differs."""
    from PIL import Image

    return image if image.size == size else image.resize(size, Image.Resampling.LANCZOS)


def load_frame(frame: Any, size: tuple[int, int] | None = None, field: str = "image") -> np.ndarray:
    """uint8 [H, W, 3] RGB from what media.image.load_image takes, resized to `size` if given."""
    from vidloom.media.image import load_image

    pil = load_image(frame, field)
    if size is not None:
        pil = fit_image(pil, size)
    return np.asarray(pil, dtype=np.uint8).copy()


def load_video(video: Any, size: tuple[int, int] | None = None) -> np.ndarray:
    """uint8 [F, H, W, 3] from a video file path, an [F, H, W, 3] array, or a list of frames (as load_image takes).

    `size` (width, height) resizes every frame. Bad input raises InvalidRequest("video").
    """
    if isinstance(video, (str, Path)):
        from vidloom.media.video import read_video

        try:
            frames, _ = read_video(Path(video))
        except (OSError, ValueError) as exc:
            raise InvalidRequest("video", f"cannot read {str(video)!r}: {exc}") from None
    elif isinstance(video, np.ndarray) and video.ndim == 4:
        frames = list(video)
    elif isinstance(video, (list, tuple)) and video:
        frames = list(video)
    else:
        raise InvalidRequest("video", "must be a path, an [F, H, W, 3] array or a non-empty list of frames")
    try:
        out = [load_frame(frame, size, "video") for frame in frames]
    except InvalidRequest as exc:
        raise InvalidRequest("video", f"frame: {exc.message}") from None
    if len({frame.shape for frame in out}) != 1:
        raise InvalidRequest("video", "frames differ in size")
    return np.stack(out)
