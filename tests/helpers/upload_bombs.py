"""Small files that claim huge media, as abusive clients send them (tests and bench/serve_abuse.py).

- `png_claiming(w, h)`: a valid PNG header of any size over a few bytes of pixel data (PIL reads
  the size from the header; decoding would allocate w*h*channels bytes).
- `uniform_h264(w, h, frames)`: a real H.264 MP4 of identical frames: a few KB on disk, frames*w*h*3
  bytes decoded. Built frame by frame, so making it costs one frame of memory.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np


def png_claiming(width: int, height: int, rows: int = 4) -> bytes:
    """A greyscale PNG whose header says width x height; its IDAT holds only `rows` rows (truncated)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale, no interlace
    pixels = zlib.compress(b"".join(b"\x00" + bytes(width) for _ in range(rows)), 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def uniform_h264(width: int, height: int, frames: int, fps: int = 8) -> bytes:
    """An MP4 of `frames` identical grey frames (libx264, ultrafast): almost all of it is skipped blocks."""
    import av

    buffer = io.BytesIO()
    frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), 128, np.uint8), format="rgb24")
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        for _ in range(frames):
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()
