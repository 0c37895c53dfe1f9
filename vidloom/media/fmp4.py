"""A fragmented MP4 (H.264) written chunk by chunk, so a player can start before the video is finished.

The file is an init segment (ftyp + moov with `empty_moov`) followed by media fragments (moof + mdat);
every `write(frames)` appends whole fragments holding exactly those frames, so the bytes on disk after
a write are a playable prefix of the final file.

Why each chunk gets its own muxer: one MP4 muxer holds the last sample of a fragment back until the
next packet arrives (to learn its duration), and PyAV cannot ask it to cut a fragment now
(`av_write_frame(ctx, NULL)`). So one encoder (libx264, zero latency: a packet per frame, no B-frames)
runs for the whole video, and each chunk's packets go through a short-lived muxer that is closed at
once; its fragments are appended with their decode time and sequence number rewritten to continue
the stream (that muxer starts both at zero). The first chunk's muxer also gives the init segment.
"""

from __future__ import annotations

import io
import struct
from fractions import Fraction
from typing import TYPE_CHECKING, BinaryIO, Iterator

import numpy as np

from vidloom.media.color import rgb_to_yuv420p

if TYPE_CHECKING:
    import av

MOVFLAGS = "frag_keyframe+empty_moov+default_base_moof+skip_trailer"
# libx264 at the finished mp4's quality; zerolatency: every frame's packet leaves the encoder at once,
# and no B-frames, so decode order is display order. One thread: the same bytes on every machine.
STREAM_CODEC_OPTIONS = {"crf": "18", "threads": "1", "tune": "zerolatency", "x264-params": "mbtree=0"}
_CONTAINERS = (b"moof", b"traf")


class FragmentedMp4Writer:
    """Appends H.264 fragments of uint8 RGB frames [F, H, W, 3] to `file` (opened for binary writing).

    Not thread-safe: one caller writes, in order. `write` returns the file's size once the chunk's
    fragments are flushed, which is what a reader following the file may serve. After a write that
    raised, every later one raises too: the encoder moved on, so the file would have a gap.
    """

    def __init__(self, file: BinaryIO, fps: int, width: int, height: int) -> None:
        import av  # on first use: `import vidloom` works without PyAV (the GPU image lacks it)
        if fps < 1:
            raise ValueError(f"fps must be >= 1, got {fps}")
        if width % 2 or height % 2:
            raise ValueError(f"yuv420p video needs even sizes, got {width}x{height}")
        self._file = file
        self.fps, self.width, self.height = fps, width, height
        self.frames = 0  # frames written so far
        self.size = 0  # bytes written so far
        self._sequence = 0  # moof sequence numbers, continued across chunks
        self.failed = False
        # The encoder lives in a container that is never written out: it only gives codec parameters.
        self._encoder_container = av.open(io.BytesIO(), mode="w", format="mp4")
        stream = self._encoder_container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = dict(STREAM_CODEC_OPTIONS)
        stream.codec_context.flags |= av.codec.context.Flags.global_header  # SPS/PPS in the init segment
        self._encoder_container.start_encoding()  # opens the encoder and fills the stream's parameters
        self._encoder = stream

    def write(self, frames: np.ndarray) -> int:
        """Encode `frames` as the next fragments (the first starts on a keyframe); returns the file size."""
        import av  # on first use: `import vidloom` works without PyAV (the GPU image lacks it)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != (self.height, self.width, 3):
            raise ValueError(f"frames must be uint8 [F, {self.height}, {self.width}, 3], got {frames.dtype} "
                             f"{frames.shape}")
        if not len(frames):
            return self.size
        if self.failed:
            raise RuntimeError("an earlier write to this stream failed; it cannot continue")
        self.failed = True  # until this write is complete
        packets = []
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb_to_yuv420p(rgb), format="yuv420p")
            frame.pts, frame.time_base = self.frames + i, Fraction(1, self.fps)
            if i == 0:  # a fragment a player can start decoding from
                frame.pict_type = av.video.frame.PictureType.I
            packets.extend(self._encoder.encode(frame))
        if len(packets) != len(frames):
            raise RuntimeError(f"the encoder held frames back ({len(packets)} packets for {len(frames)} frames)")
        first = self.frames
        self.frames += len(frames)
        size = self._append(self._mux(packets, first), with_init=first == 0)
        self.failed = False
        return size

    def close(self) -> None:
        """Release the encoder (the file stays open: it belongs to the caller)."""
        self._encoder_container.close()

    def _mux(self, packets: list[av.Packet], first_frame: int) -> tuple[bytes, int]:
        """The packets as a standalone fragmented MP4, and the decode time of `first_frame` in its timescale."""
        import av  # on first use: `import vidloom` works without PyAV (the GPU image lacks it)
        buffer = io.BytesIO()
        with av.open(buffer, mode="w", format="mp4", options={"movflags": MOVFLAGS, "fflags": "+bitexact"}) as mux:
            stream = mux.add_stream_from_template(self._encoder, opaque=True)
            for packet in packets:
                packet.stream = stream
                mux.mux(packet)
            time_base = stream.time_base
        start = Fraction(first_frame, self.fps) / time_base
        if start.denominator != 1:
            raise RuntimeError(f"frame {first_frame} at {self.fps} fps is not a whole tick of {time_base}")
        return buffer.getvalue(), int(start)

    def _append(self, muxed: tuple[bytes, int], *, with_init: bool) -> int:
        data, start = muxed
        out = bytearray()
        for kind, box in _boxes(data):
            if kind in (b"ftyp", b"moov") and with_init:
                out += box
            elif kind == b"moof":
                self._sequence += 1
                out += _rebase_fragment(box, self._sequence, start)
            elif kind == b"mdat":
                out += box
        self._file.write(out)
        self._file.flush()
        self.size += len(out)
        return self.size


def _boxes(data: bytes | bytearray, start: int = 0, end: int | None = None) -> Iterator[tuple[bytes, memoryview]]:
    """(type, whole box) of the boxes in data[start:end]; 32-bit sizes only (what the muxer writes here)."""
    view = memoryview(data)
    end = len(data) if end is None else end
    offset = start
    while offset < end:
        size, kind = struct.unpack_from(">I4s", data, offset)
        if size < 8 or offset + size > end:
            raise ValueError(f"malformed MP4 box {kind!r} of {size} bytes at {offset}")
        yield kind, view[offset : offset + size]
        offset += size


def _rebase_fragment(moof: memoryview, sequence: int, start: int) -> bytes:
    """A copy of `moof` with its sequence number set and every track's decode time moved by `start` ticks."""
    box = bytearray(moof)
    _patch(box, 8, len(box), sequence, start)
    return bytes(box)


def _patch(box: bytearray, start: int, end: int, sequence: int, shift: int) -> None:
    offset = start
    for kind, child in _boxes(box, start, end):
        size = len(child)
        if kind == b"mfhd":  # full box: version/flags, then the sequence number
            struct.pack_into(">I", box, offset + 12, sequence)
        elif kind == b"tfdt":
            version = box[offset + 8]
            if version != 1:
                raise ValueError("expected a 64-bit tfdt (version 1) from the muxer")
            (time,) = struct.unpack_from(">Q", box, offset + 12)
            struct.pack_into(">Q", box, offset + 12, time + shift)
        elif kind in _CONTAINERS:
            _patch(box, offset + 8, offset + size, sequence, shift)
        offset += size
