"""Uploaded video files held compressed: checked from the container, decoded only when the job runs.

A small file can claim a huge video (77 frames of 4096x4096 H.264 fit in 53 KB). `open_video` checks
what the container says before any frame is decoded (frame size from the stream header, frame count
from the metadata and the duration, then exactly by counting packets, which demuxes without decoding)
and returns an EncodedVideo: the file's bytes plus those numbers. A queued job holds that; the thread
that runs the job calls `decode_media`, which decodes frame by frame with a running count that stops at
the checked count, and resizes each frame to the request's size as it comes (the recipes resize every
frame to it with the same Lanczos filter anyway), so a running job holds frames at its own size.
"""

from __future__ import annotations

import dataclasses
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from vidloom.core.errors import InvalidRequest, counted
from vidloom.media.decode_errors import decode_reason
from vidloom.media.image import MAX_MEDIA_PIXELS, MAX_VIDEO_FRAMES, EncodedImage, fit_image, load_image
from vidloom.media.upload_formats import VIDEO_UPLOAD, MediaFormat, check_codec, sniffed_format

# Decoded pixels of a whole file (frames x width x height): bounds the decode work one job may ask for.
# 1025 frames at 1280x720, past every video length and resolution a served model takes.
MAX_VIDEO_PIXELS = MAX_VIDEO_FRAMES * 1280 * 720


@dataclass(frozen=True, eq=False)
class EncodedVideo:
    """A video file checked from its container (frame size, exact frame count) and not decoded yet.

    `size` is the frames' (width, height) like a PIL image's and len() their count, so the request's
    checks (frame rules, size from the input) run on it before decoding.
    """

    source: bytes | str  # the file's bytes (an upload) or its path
    size: tuple[int, int]
    frames: int
    field: str
    demuxer: str | None = None  # the FFmpeg demuxer an upload is read with (media.upload_formats); None: probed

    def __len__(self) -> int:
        return self.frames

    def decode(self, size: tuple[int, int] | None = None) -> list[Image.Image]:
        """The RGB frames, each resized to `size` (width, height) as it is decoded when given."""
        return _decode(self, size)


def open_video(value: Any, field: str, min_frames: int = 1, max_frames: int | None = None) -> Any:
    """A file (path or bytes) checked from its container as an EncodedVideo; frames or arrays as load_video."""
    limit = MAX_VIDEO_FRAMES if max_frames is None else max_frames
    if isinstance(value, (str, Path, bytes, bytearray)):
        value = probe_video(value, field, limit)
    if not isinstance(value, EncodedVideo):
        return load_video(value, field, min_frames, max_frames)
    if value.frames > limit:
        raise InvalidRequest(field, f"has more than {limit} frames (max_frames)")
    if value.frames < min_frames:
        raise InvalidRequest(field, f"has {counted(value.frames, 'frame')}; at least {min_frames} are needed")
    return value


def load_video(value: Any, field: str, min_frames: int = 1, max_frames: int | None = None) -> list[Image.Image]:
    """RGB frames from a list of images/arrays, an [F, H, W, 3] array, a video file path or its bytes.
    A file is decoded only up to `max_frames` (default MAX_VIDEO_FRAMES); more is an error."""
    limit = MAX_VIDEO_FRAMES if max_frames is None else max_frames
    if isinstance(value, (str, Path, bytes, bytearray)):
        value = open_video(value, field, min_frames, limit)  # checked from its container first
    if isinstance(value, EncodedVideo):
        frames: Sequence[Any] = value.decode()
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
        raise InvalidRequest(field, f"has {counted(len(frames), 'frame')}; at least {min_frames} are needed")
    images = [load_image(frame, f"{field}[{i}]") for i, frame in enumerate(frames)]
    if len({im.size for im in images}) > 1:
        raise InvalidRequest(field, "frames differ in size")
    return images


def probe_video(value: str | Path | bytes | bytearray, field: str, limit: int) -> EncodedVideo:
    """Check a video file against the limits from its container alone; no frame is decoded. Bytes (an upload)
    must be an MP4 or WebM of a VIDEO_UPLOAD codec, read with that container's demuxer alone."""
    import av  # PyAV is already the MP4 writer's dependency

    fmt: MediaFormat | None = None
    if isinstance(value, (str, Path)):
        if not Path(value).is_file():
            raise InvalidRequest(field, f"file {str(value)!r} does not exist")
        source: bytes | str = str(value)
    else:
        source = bytes(value)
        fmt = sniffed_format(source, field, VIDEO_UPLOAD, "video")
    demuxer = None if fmt is None else fmt.demuxer
    try:
        with av.open(source if isinstance(source, str) else io.BytesIO(source), format=demuxer) as container:
            if not container.streams.video:
                raise InvalidRequest(field, "has no video stream")
            stream = container.streams.video[0]
            if fmt is not None:
                check_codec(stream, fmt, field)
            width, height = stream.codec_context.width, stream.codec_context.height
            _check_frame_size(field, width, height)
            _check_count(field, _declared_frames(stream), limit, width * height)
            frames = _count_packets(container, stream, field, limit, width * height)
    except InvalidRequest:
        raise
    except (av.error.FFmpegError, ValueError, IndexError, OSError) as exc:
        raise InvalidRequest(field, f"is not a readable video ({decode_reason(exc)})") from None
    if frames < 1:
        raise InvalidRequest(field, "has no frames")
    return EncodedVideo(source, (width, height), frames, field, demuxer)


def decode_media(request: Any) -> Any:
    """`request` (a resolved GenerationRequest) with its EncodedImage / EncodedVideo inputs decoded.

    Called by the thread that runs the job, when it starts: until then the job holds only the files.
    """
    changes: dict[str, Any] = {}
    if request.image is not None and any(isinstance(i, EncodedImage) for i in request.image):
        changes["image"] = tuple(i.decode() if isinstance(i, EncodedImage) else i for i in request.image)
    if isinstance(request.last_image, EncodedImage):
        changes["last_image"] = request.last_image.decode()
    if isinstance(request.video, EncodedVideo):
        changes["video"] = request.video.decode((request.width, request.height))
    return dataclasses.replace(request, **changes) if changes else request


def _check_frame_size(field: str, width: int, height: int) -> None:
    if width < 1 or height < 1:
        raise InvalidRequest(field, "has no frame size in its stream header")
    if width * height > MAX_MEDIA_PIXELS:
        raise InvalidRequest(field, f"has {width}x{height} frames, more than {MAX_MEDIA_PIXELS} pixels each "
                                    "(MAX_MEDIA_PIXELS)")


def _check_count(field: str, frames: int, limit: int, frame_pixels: int) -> None:
    if frames > limit:
        raise InvalidRequest(field, f"has more than {limit} frames (max_frames)")
    if frames * frame_pixels > MAX_VIDEO_PIXELS:
        raise InvalidRequest(field, f"has {frames} frames of {frame_pixels} pixels, more than {MAX_VIDEO_PIXELS} "
                                    "pixels in all (MAX_VIDEO_PIXELS)")


def _declared_frames(stream: Any) -> int:
    """The frame count the metadata states, or its duration x frame rate (rounded down); 0 when it says neither."""
    if stream.frames:
        return int(stream.frames)
    if stream.duration and stream.time_base and stream.average_rate:
        seconds = float(stream.duration * stream.time_base)
        return max(0, math.floor(seconds * float(stream.average_rate)))
    return 0


def _count_packets(container: Any, stream: Any, field: str, limit: int, frame_pixels: int) -> int:
    """Frames in the file, one per packet, counted by demuxing (reading compressed packets, decoding none);
    stops one past the limit."""
    frames = 0
    for packet in container.demux(stream):
        if packet.size:  # the demuxer ends with an empty flush packet
            frames += 1
            _check_count(field, frames, limit, frame_pixels)
    return frames


def _decode(video: EncodedVideo, size: tuple[int, int] | None) -> list[Image.Image]:
    import av

    out: list[Image.Image] = []
    source = video.source if isinstance(video.source, str) else io.BytesIO(video.source)
    try:
        with av.open(source, format=video.demuxer) as container:
            for frame in container.decode(video=0):
                if len(out) == video.frames:
                    break  # the running count stops at the count checked before the job was queued
                if (frame.width, frame.height) != video.size:
                    raise InvalidRequest(video.field, f"frame {len(out)} is {frame.width}x{frame.height} but the "
                                                      f"stream header says {video.size[0]}x{video.size[1]}")
                image = frame.to_image()
                out.append(image if size is None else fit_image(image, size))
    except InvalidRequest:
        raise
    except (av.error.FFmpegError, ValueError, IndexError, OSError) as exc:
        raise InvalidRequest(video.field, f"is not a readable video ({decode_reason(exc)})") from None
    if len(out) < video.frames:
        raise InvalidRequest(video.field, f"decoded to {len(out)} frames but its container holds {video.frames}")
    return out
