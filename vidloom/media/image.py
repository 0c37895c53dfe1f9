"""Input images and videos from what a caller hands over (PIL, numpy, path, upload bytes);
output images as PNG / JPEG / WebP bytes.

Every input failure is an InvalidRequest naming the request field, so the Python API, the CLI and
the server report a bad upload the same way.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from vidloom.core.errors import InvalidRequest

# PIL modes that have an unambiguous RGB rendering; others (16-bit "I;16", float "F", 1-bit)
# would need a scaling choice the caller should make.
CONVERTIBLE_MODES = frozenset({"RGB", "RGBA", "L", "LA", "P", "PA", "CMYK", "YCbCr"})
# Pixels per decoded image or video frame: a small compressed upload must not decode into gigabytes.
# 4096 x 4096 is past every Wan resolution (frames are resized to the request size anyway).
MAX_MEDIA_PIXELS = 4096 * 4096
# Frames decoded from a video when the caller sets no limit (a server passes its max_frames).
MAX_VIDEO_FRAMES = 1025
IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


def load_images(value: Any, field: str = "image") -> tuple[Image.Image, ...]:
    """One image or a list/tuple of them (anything load_image takes) as a tuple of RGB PIL images."""
    items = value if isinstance(value, (list, tuple)) else (value,)
    if not items:
        raise InvalidRequest(field, "must be one or more images")
    if len(items) == 1:
        return (load_image(items[0], field),)
    return tuple(load_image(item, f"{field}[{i}]") for i, item in enumerate(items))


def load_image(value: Any, field: str = "image") -> Image.Image:
    """An RGB PIL image from a PIL image, an HxW(xC) array (uint8, or float in [0, 1]), a file path or
    the bytes of an image file (an HTTP upload)."""
    if isinstance(value, (str, Path)):
        value = _open_path(Path(value), field)
    elif isinstance(value, (bytes, bytearray)):
        value = _open_bytes(bytes(value), field)
    elif isinstance(value, np.ndarray):
        value = _from_array(value, field)
    if not isinstance(value, Image.Image):
        raise InvalidRequest(field, f"must be a PIL image, a numpy array or a file path, got {type(value).__name__}")
    if value.mode not in CONVERTIBLE_MODES:
        raise InvalidRequest(
            field, f"image mode {value.mode!r} is not supported; give one of {', '.join(sorted(CONVERTIBLE_MODES))}"
        )
    if min(value.size) < 1:
        raise InvalidRequest(field, f"image is empty ({value.size[0]}x{value.size[1]})")
    if value.size[0] * value.size[1] > MAX_MEDIA_PIXELS:
        raise InvalidRequest(field, f"{value.size[0]}x{value.size[1]} is more than {MAX_MEDIA_PIXELS} pixels "
                                    "(MAX_MEDIA_PIXELS)")
    return value if value.mode == "RGB" else value.convert("RGB")


def load_video(value: Any, field: str, min_frames: int = 1, max_frames: int | None = None) -> list[Image.Image]:
    """RGB frames from a list of images/arrays, an [F, H, W, 3] array, a video file path or its bytes.
    A file is decoded only up to `max_frames` (default MAX_VIDEO_FRAMES); more is an error."""
    limit = MAX_VIDEO_FRAMES if max_frames is None else max_frames
    if isinstance(value, (str, Path)):
        if not Path(value).is_file():
            raise InvalidRequest(field, f"file {str(value)!r} does not exist")
        frames: Sequence[Any] = _decode_video(str(value), field, limit)
    elif isinstance(value, (bytes, bytearray)):
        frames = _decode_video(io.BytesIO(bytes(value)), field, limit)
    elif isinstance(value, np.ndarray):
        if value.ndim != 4:
            raise InvalidRequest(field, f"a video array must be [frames, height, width, channels], got {value.shape}")
        frames = list(value)
    elif isinstance(value, (list, tuple)):
        frames = value
    else:
        raise InvalidRequest(
            field, f"must be a list of frames, an array or a video file path, got {type(value).__name__}"
        )
    if len(frames) > limit:
        raise InvalidRequest(field, f"has more than {limit} frames (max_frames)")
    if len(frames) < min_frames:
        raise InvalidRequest(field, f"has {len(frames)} frames; at least {min_frames} are needed")
    images = [load_image(frame, f"{field}[{i}]") for i, frame in enumerate(frames)]
    if len({im.size for im in images}) > 1:
        raise InvalidRequest(field, "frames differ in size")
    return images


def fit_image(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """`image` at `size` (width, height), resized with Lanczos (diffusers' default for PIL inputs) if it differs."""
    return image if image.size == size else image.resize(size, resample=Image.Resampling.LANCZOS)


def encode_image(frame: np.ndarray, fmt: str = "png") -> bytes:
    """uint8 HxWx3 -> file bytes in `fmt` (png, jpeg, webp)."""
    if fmt not in IMAGE_FORMATS:
        raise InvalidRequest("output_format", f"unknown format {fmt!r}; known: {', '.join(IMAGE_FORMATS)}")
    buf = io.BytesIO()
    Image.fromarray(frame, "RGB").save(buf, format=IMAGE_FORMATS[fmt])
    return buf.getvalue()


def image_to_tensor(image: Image.Image, height: int, width: int) -> torch.Tensor:
    """[3, height, width] float32 in [-1, 1]: resized with Lanczos and scaled as diffusers'
    VaeImageProcessor does, so a conditioning frame matches the reference pipelines."""
    image = fit_image(image, (width, height))
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    return torch.from_numpy(pixels).permute(2, 0, 1) * 2.0 - 1.0


def _open_path(path: Path, field: str) -> Image.Image:
    try:
        with Image.open(path) as image:
            image.load()
            return image
    except FileNotFoundError:
        raise InvalidRequest(field, f"file {str(path)!r} does not exist") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise InvalidRequest(field, f"{str(path)!r} is not a readable image ({exc})") from None


def _from_array(array: np.ndarray, field: str) -> Image.Image:
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)):
        raise InvalidRequest(field, f"an image array must be HxW, HxWx3 or HxWx4, got shape {array.shape}")
    if array.dtype != np.uint8:
        if not np.issubdtype(array.dtype, np.floating):
            raise InvalidRequest(field, f"an image array must be uint8 or float in [0, 1], got {array.dtype}")
        if not np.isfinite(array).all() or array.min() < 0.0 or array.max() > 1.0:
            raise InvalidRequest(field, "a float image array must hold finite values in [0, 1]")
        array = np.round(array * 255.0).astype(np.uint8)
    return Image.fromarray(np.ascontiguousarray(array))


def _open_bytes(data: bytes, field: str) -> Image.Image:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidRequest(field, f"the upload is not a readable image ({exc})") from None


def _decode_video(source: str | io.BytesIO, field: str, limit: int) -> list[np.ndarray]:
    import av  # PyAV is already the MP4 writer's dependency

    frames: list[np.ndarray] = []
    try:
        with av.open(source) as container:
            for frame in container.decode(video=0):
                if len(frames) == limit or frame.width * frame.height > MAX_MEDIA_PIXELS:
                    # Stop before decoding more: one frame past the limit is enough to refuse.
                    what = "frames" if len(frames) == limit else "pixels per frame (MAX_MEDIA_PIXELS)"
                    raise InvalidRequest(field, f"has more {what} than allowed ({limit} frames, "
                                                f"{MAX_MEDIA_PIXELS} pixels)")
                frames.append(frame.to_ndarray(format="rgb24"))
    except (av.error.FFmpegError, ValueError, IndexError) as exc:
        if isinstance(exc, InvalidRequest):
            raise
        raise InvalidRequest(field, f"is not a readable video ({exc})") from None
    return frames
