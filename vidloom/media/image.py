"""Input images and videos from what a caller hands over (PIL, numpy, path, upload bytes);
output images as PNG / JPEG / WebP bytes.

Every input failure is an InvalidRequest naming the request field, so the Python API, the CLI and
the server report a bad upload the same way. A file's size is checked from its header before any
pixel is decoded; `open_image` stops there and returns an EncodedImage that a queued job holds
compressed and the job decodes when it runs (video files: media.uploads).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from vidloom.core.errors import InvalidRequest
from vidloom.media.decode_errors import decode_reason
from vidloom.media.frames import to_uint8
from vidloom.media.upload_formats import IMAGE_UPLOAD

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

T = TypeVar("T")


def load_images(value: Any, field: str = "image") -> tuple[Image.Image, ...]:
    """One image or a list/tuple of them (anything load_image takes) as a tuple of RGB PIL images."""
    return _each_image(value, field, load_image)


def _each_image(value: Any, field: str, read: Callable[[Any, str], T]) -> tuple[T, ...]:
    """`read` of one image, or of each in a list/tuple (named field[i] in errors when there are several)."""
    items = value if isinstance(value, (list, tuple)) else (value,)
    if not items:
        raise InvalidRequest(field, "must be one or more images")
    if len(items) == 1:
        return (read(items[0], field),)
    return tuple(read(item, f"{field}[{i}]") for i, item in enumerate(items))


@dataclass(frozen=True, eq=False)
class EncodedImage:
    """An image file checked from its header (size and mode within limits) and not decoded yet.

    `size` is (width, height) like a PIL image's, so size checks run on it before decoding.
    """

    source: bytes | str  # the file's bytes (an upload) or its path
    size: tuple[int, int]
    field: str

    def decode(self) -> Image.Image:
        """The RGB pixels (InvalidRequest naming the field if the file is broken past its header)."""
        return load_image(self.source if isinstance(self.source, bytes) else Path(self.source), self.field)


def open_images(value: Any, field: str = "image") -> tuple[Image.Image | EncodedImage, ...]:
    """load_images, but files are only checked from their headers (EncodedImage), not decoded."""
    return _each_image(value, field, open_image)


def open_image(value: Any, field: str = "image") -> Image.Image | EncodedImage:
    """A file (path or bytes) checked from its header as an EncodedImage; anything else as load_image."""
    if isinstance(value, EncodedImage):
        return value
    if isinstance(value, (bytes, bytearray)):
        data = bytes(value)
        with _opened(io.BytesIO(data), field, "the upload") as image:
            return EncodedImage(data, image.size, field)
    if isinstance(value, (str, Path)):
        with _opened(Path(value), field, repr(str(value))) as image:
            return EncodedImage(str(value), image.size, field)
    return load_image(value, field)


def load_image(value: Any, field: str = "image") -> Image.Image:
    """An RGB PIL image from a PIL image, an HxW(xC) array (uint8, or float in [0, 1]), a file path or
    the bytes of an image file (an HTTP upload). A file's size is checked from its header first."""
    if isinstance(value, EncodedImage):
        return value.decode()
    if isinstance(value, (str, Path)):
        value = _decode(Path(value), field, repr(str(value)))
    elif isinstance(value, (bytes, bytearray)):
        value = _decode(io.BytesIO(bytes(value)), field, "the upload")
    elif isinstance(value, np.ndarray):
        value = _from_array(value, field)
    if not isinstance(value, Image.Image):
        raise InvalidRequest(field, f"must be a PIL image, a numpy array or a file path, got {type(value).__name__}")
    _check_header(value, field)
    return value if value.mode == "RGB" else value.convert("RGB")


def _check_header(image: Image.Image, field: str) -> None:
    """What an image file's header tells (mode, size) against the limits; also run on decoded images."""
    if image.mode not in CONVERTIBLE_MODES:
        raise InvalidRequest(
            field, f"image mode {image.mode!r} is not supported; give one of {', '.join(sorted(CONVERTIBLE_MODES))}"
        )
    if min(image.size) < 1:
        raise InvalidRequest(field, f"image is empty ({image.size[0]}x{image.size[1]})")
    if image.size[0] * image.size[1] > MAX_MEDIA_PIXELS:
        raise InvalidRequest(field, f"{image.size[0]}x{image.size[1]} is more than {MAX_MEDIA_PIXELS} pixels "
                                    "(MAX_MEDIA_PIXELS)")


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


@contextlib.contextmanager
def _opened(source: Path | io.BytesIO, field: str, what: str) -> Iterator[Image.Image]:
    """The file opened and checked from its header alone: Image.open reads no pixel data. An upload (bytes) opens
    only as one of IMAGE_UPLOAD's formats: PIL never tries its other parsers on a client's bytes."""
    upload = isinstance(source, io.BytesIO)
    try:
        with warnings.catch_warnings():
            # PIL's own bomb check (Image.MAX_IMAGE_PIXELS, ~89 Mpx: a warning, twice that: an error) is
            # looser than MAX_MEDIA_PIXELS; the error is turned into ours below, the warning is moot.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(source, formats=IMAGE_UPLOAD if upload else None)
    except UnidentifiedImageError if upload else ():
        raise InvalidRequest(field, f"{what} is not a readable image (this server reads "
                                    f"{', '.join(IMAGE_UPLOAD)} uploads)") from None
    except FileNotFoundError:
        raise InvalidRequest(field, f"file {what} does not exist") from None
    except Image.DecompressionBombError:
        raise InvalidRequest(field, f"{what} is an image of more than {MAX_MEDIA_PIXELS} pixels "
                                    "(MAX_MEDIA_PIXELS)") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InvalidRequest(field, f"{what} is not a readable image ({decode_reason(exc)})") from None
    with image:
        _check_header(image, field)
        yield image


def _decode(source: Path | io.BytesIO, field: str, what: str) -> Image.Image:
    with _opened(source, field, what) as image:
        try:
            image.load()
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise InvalidRequest(field, f"{what} is not a readable image ({decode_reason(exc)})") from None
        return image


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
        array = to_uint8(array)
    return Image.fromarray(np.ascontiguousarray(array))
