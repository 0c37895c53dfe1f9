"""Encode frames to MP4 (H.264), WebM (VP9), GIF and PNG via PyAV; every write is atomic.

Encodes are reproducible: the same frames give the same bytes whatever the process
encoded before (the RGB -> YUV / palette conversion is ours, see media/color.py).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vidloom.media.atomic import atomic_path
from vidloom.media.audio import AudioStreamWriter, AudioTrack, check_muxable
from vidloom.media.color import rgb_to_palette_indices, rgb_to_yuv420p, web_palette

if TYPE_CHECKING:
    import av


# container format -> (codec, codec options). Constant-quality rate control, one encoder thread.
# x264's MB-tree gave a few different bitstreams for the same input within one process (same
# frames, threads=1; issue 17), while constant QP or crf without MB-tree always agreed: it is off.
# One thread, so bytes do not depend on the machine's core count either.
VIDEO_CODECS: dict[str, tuple[str, dict[str, str]]] = {
    "mp4": ("libx264", {"crf": "18", "threads": "1", "x264-params": "mbtree=0"}),
    "webm": ("libvpx-vp9", {"crf": "30", "b": "0", "deadline": "good", "cpu-used": "4", "threads": "1"}),
}


def write_video(frames: np.ndarray, fps: int, path: Path, crf: int = 18, container_format: str = "mp4",
                audio: AudioTrack | None = None) -> Path:
    """Write uint8 frames [F, H, W, 3] as H.264 MP4 or VP9 WebM (yuv420p, so H and W must be even), with
    `audio` muxed beside them (AAC / Opus, lasting as long as the video: see media/audio.py)."""
    import av  # on first use: `import vidloom` works without PyAV (the GPU image lacks it)

    _check_frames(frames)
    if audio is not None:
        check_muxable(audio, container_format, path)
    _, height, width, _ = frames.shape
    if height % 2 or width % 2:
        raise ValueError(f"yuv420p video needs even sizes, got {width}x{height}")
    codec, options = VIDEO_CODECS[container_format]
    if container_format == "mp4":
        options = {**options, "crf": str(crf)}
    with atomic_path(path) as tmp:
        # bitexact: no random ids in the container (Matroska/WebM writes a random SegmentUID otherwise)
        with av.open(str(tmp), mode="w", format=container_format, options={"fflags": "+bitexact"}) as container:
            stream = container.add_stream(codec, rate=fps)
            stream.width, stream.height = width, height
            stream.pix_fmt = "yuv420p"
            stream.options = options
            sound = None if audio is None else AudioStreamWriter(container, audio, container_format, len(frames) / fps)
            for index, frame in enumerate(frames):
                yuv = av.VideoFrame.from_ndarray(rgb_to_yuv420p(frame), format="yuv420p")
                for packet in stream.encode(yuv):
                    container.mux(packet)
                if sound is not None:  # the sound under this frame, so the muxer need not buffer either stream
                    sound.mux_until((index + 1) / fps)
            for packet in stream.encode():
                container.mux(packet)
            if sound is not None:
                sound.finish()
    return path


def write_gif(frames: np.ndarray, fps: int, path: Path) -> Path:
    """Write uint8 frames [F, H, W, 3] as an animated GIF over a fixed 252-colour palette.

    GIF stores each frame's delay in centiseconds, so 1000/fps ms is rarely a whole number of them
    (8 fps: 12.5 cs). Frame i ends at the centisecond nearest i+1 frame periods (gif_frame_ends):
    delays alternate (13, 12, 13, ... at 8 fps), every frame ends within 5 ms of its exact time
    and the whole GIF lasts F * 1000/fps ms to the nearest 10 ms.
    """
    import av  # on first use: `import vidloom` works without PyAV (the GPU image lacks it)
    _check_frames(frames)
    palette = web_palette()
    centisecond = Fraction(1, 100)
    starts = [0, *gif_frame_ends(len(frames), fps)]
    delays = {start: end - start for start, end in zip(starts, starts[1:])}  # pts -> delay, both in cs
    with atomic_path(path) as tmp:
        with av.open(str(tmp), mode="w", format="gif") as container:
            stream = container.add_stream("gif", rate=fps)
            stream.codec_context.time_base = stream.time_base = centisecond  # our timestamps, not a rescale's
            stream.width, stream.height = frames.shape[2], frames.shape[1]
            stream.pix_fmt = "pal8"
            for frame, start in zip(frames, starts):
                indexed = av.VideoFrame.from_ndarray((rgb_to_palette_indices(frame), palette), format="pal8")
                indexed.pts, indexed.time_base = start, centisecond
                for packet in stream.encode(indexed):
                    _mux_gif_packet(container, packet, delays)
            for packet in stream.encode():
                _mux_gif_packet(container, packet, delays)
    return path


def _mux_gif_packet(container: av.container.OutputContainer, packet: av.Packet, delays: dict[int, int]) -> None:
    # The muxer takes a frame's delay from the next packet's pts, and the last frame's from its packet's
    # duration, which the GIF encoder leaves at 0 (the muxer would then repeat the previous delay).
    packet.duration = delays[packet.pts]
    container.mux(packet)


def gif_frame_ends(count: int, fps: int) -> list[int]:
    """The centisecond at which each of `count` frames at `fps` ends: (i+1) * 100/fps, rounded half up."""
    return [((i + 1) * 200 + fps) // (2 * fps) for i in range(count)]


def write_png(frame: np.ndarray, path: Path) -> Path:
    """Write one uint8 [H, W, 3] frame as PNG."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(encode_png(frame))
    return path


def encode_png(frame: np.ndarray) -> bytes:
    """One uint8 [H, W, 3] frame as PNG bytes, in memory (for HTTP answers that never touch disk)."""
    import av  # on first use: `import vidloom` works without PyAV (the GPU image lacks it)
    codec = av.CodecContext.create("png", "w")
    codec.width, codec.height = frame.shape[1], frame.shape[0]
    codec.pix_fmt = "rgb24"
    packets = [*codec.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")), *codec.encode(None)]
    return b"".join(bytes(packet) for packet in packets)


def read_video(path: Path) -> tuple[np.ndarray, float]:
    """Decode a video file back to uint8 frames [F, H, W, 3] and its frame rate."""
    import av  # on first use: `import vidloom` works without PyAV (the GPU image lacks it)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        fps = float(stream.average_rate) if stream.average_rate else 0.0
    return np.stack(frames), fps


def _check_frames(frames: np.ndarray) -> None:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [F, H, W, 3], got {frames.dtype} {frames.shape}")
