"""Input images: paths, arrays or PIL images -> RGB PIL images; output images -> PNG/JPEG/WebP bytes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from PIL import Image, UnidentifiedImageError

from vidloom.core.errors import InvalidRequest

IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
# Largest input image we decode (width * height), checked from the header before any pixel is read:
# 64 Mpx is 4x a large camera photo; Flux2 shrinks references to 1 Mpx anyway.
MAX_INPUT_IMAGE_PIXELS = 64 * 1024 * 1024


def load_images(value: Any, field: str = "image") -> tuple[Image.Image, ...]:
    """One image or a list/tuple of them (PIL image, path, HxWx3 array uint8 or float in [0, 1], bytes)."""
    items: Iterable[Any] = value if isinstance(value, (list, tuple)) else (value,)
    images = tuple(load_image(item, field, i) for i, item in enumerate(items))
    if not images:
        raise InvalidRequest(field, "must be one or more images")
    return images


def load_image(value: Any, field: str = "image", index: int = 0) -> Image.Image:
    """One RGB image; errors name `field` and say which image (0-based `index`) is wrong."""
    which = f"image {index}"
    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, (bytes, bytearray)):
        return _decode(bytes(value), field, which)
    if isinstance(value, (str, Path)):
        path = Path(value)
        if not path.is_file():
            raise InvalidRequest(field, f"{which}: {path}: no such image file")
        return _decode(path.read_bytes(), field, which)
    if isinstance(value, np.ndarray):
        return _from_array(value, field, which)
    raise InvalidRequest(field, f"{which} must be a PIL image, a path or an HxWx3 array, got {type(value).__name__}")


def _decode(data: bytes, field: str, which: str) -> Image.Image:
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > MAX_INPUT_IMAGE_PIXELS:
                raise InvalidRequest(field, f"{which} is {img.width}x{img.height}, more than the limit of "
                                            f"{MAX_INPUT_IMAGE_PIXELS} pixels (MAX_INPUT_IMAGE_PIXELS)")
            img.load()
            return img.convert("RGB")
    except InvalidRequest:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidRequest(field, f"{which} is not a readable image ({type(exc).__name__})") from None


def _from_array(array: np.ndarray, field: str, which: str) -> Image.Image:
    if array.ndim != 3 or array.shape[-1] != 3:
        raise InvalidRequest(field, f"{which}: array must be HxWx3, got shape {array.shape}")
    if array.dtype != np.uint8:
        if not np.issubdtype(array.dtype, np.floating) or not np.isfinite(array).all():
            raise InvalidRequest(field, f"{which}: array must be uint8 or finite floats in [0, 1], got {array.dtype}")
        array = (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
    return Image.fromarray(array, "RGB")


def encode_image(frame: np.ndarray, fmt: str = "png") -> bytes:
    """uint8 HxWx3 -> file bytes in `fmt` (png, jpeg, webp)."""
    if fmt not in IMAGE_FORMATS:
        raise InvalidRequest("output_format", f"unknown format {fmt!r}; known: {', '.join(IMAGE_FORMATS)}")
    buf = io.BytesIO()
    Image.fromarray(frame, "RGB").save(buf, format=IMAGE_FORMATS[fmt])
    return buf.getvalue()
