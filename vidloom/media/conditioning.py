"""Read conditioning inputs (an I2V image, a V2V context video) into the uint8 RGB arrays requests carry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vidloom.core.errors import InvalidRequest


def load_image(image: Any, size: tuple[int, int] | None = None) -> np.ndarray:
    """uint8 [H, W, 3] RGB from a PIL image, a path, or an array ([H, W, 3] uint8, or float in [0, 1]).

    `size` (width, height) resizes with Lanczos (diffusers' default for PIL inputs) when it differs.
    Bad input raises InvalidRequest("image").
    """
    from PIL import Image

    if isinstance(image, (str, Path)):
        try:
            with Image.open(image) as opened:
                image = opened.convert("RGB")
        except (OSError, ValueError) as exc:
            raise InvalidRequest("image", f"cannot read {str(image)!r}: {exc}") from None
    if isinstance(image, Image.Image):
        pil = image.convert("RGB")
    elif isinstance(image, np.ndarray):
        pil = Image.fromarray(_as_uint8(image))
    else:
        raise InvalidRequest("image", f"must be a PIL image, an array or a path, got {type(image).__name__}")
    if size is not None and pil.size != size:
        pil = pil.resize(size, Image.Resampling.LANCZOS)
    return np.asarray(pil, dtype=np.uint8).copy()


def _as_uint8(array: np.ndarray) -> np.ndarray:
    if array.ndim != 3 or array.shape[2] != 3:
        raise InvalidRequest("image", f"array must be [height, width, 3] RGB, got shape {array.shape}")
    if array.dtype == np.uint8:
        return array
    if np.issubdtype(array.dtype, np.floating):
        if array.size and (np.nanmin(array) < 0 or np.nanmax(array) > 1 or np.isnan(array).any()):
            raise InvalidRequest("image", "a float array must hold values in [0, 1]")
        return np.round(array * 255).astype(np.uint8)
    raise InvalidRequest("image", f"array dtype must be uint8 or float, got {array.dtype}")


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
        out = [load_image(frame, size) for frame in frames]
    except InvalidRequest as exc:
        raise InvalidRequest("video", f"frame: {exc.message}") from None
    if len({frame.shape for frame in out}) != 1:
        raise InvalidRequest("video", "frames differ in size")
    return np.stack(out)
