"""The chunk-by-chunk fragmented MP4: every write leaves a playable prefix holding exactly the frames so far."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from vidloom.media.fmp4 import FragmentedMp4Writer
from vidloom.media.video import read_video, write_video

# A smooth moving gradient: compressible, so quality checks are about the encoder, not noise.
_Y, _X = np.mgrid[0:32, 0:48]
FRAMES = np.stack([np.stack([(_X * 5 + 9 * t) % 256, (_Y * 7) % 256, np.full_like(_X, 20 * t)], -1)
                   for t in range(11)]).astype(np.uint8)
CHUNKS = [(0, 1), (1, 5), (5, 11)]


def _decode(data: bytes) -> tuple[np.ndarray, list[int], float]:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        seconds = [float(f.pts * f.time_base) for f in frames]
        return np.stack([f.to_ndarray(format="rgb24") for f in frames]), seconds, float(stream.average_rate)


def _write(chunks=CHUNKS) -> tuple[bytes, list[int]]:
    out = io.BytesIO()
    writer = FragmentedMp4Writer(out, fps=8, width=48, height=32)
    sizes = [writer.write(FRAMES[a:b]) for a, b in chunks]
    writer.close()
    return out.getvalue(), sizes


def test_each_write_leaves_a_playable_prefix_with_exactly_the_frames_so_far():
    data, sizes = _write()
    assert sizes == sorted(sizes) and sizes[-1] == len(data)
    for (_, stop), size in zip(CHUNKS, sizes):
        frames, seconds, _ = _decode(data[:size])
        assert len(frames) == stop
        assert seconds == pytest.approx([i / 8 for i in range(stop)])  # time stamps continue across chunks


def test_the_whole_stream_is_the_video_at_the_finished_mp4s_quality(tmp_path):
    data, _ = _write()
    frames, _, fps = _decode(data)
    assert fps == 8 and frames.shape == FRAMES.shape
    finished, _ = read_video(write_video(FRAMES, 8, tmp_path / "v.mp4"))
    # Same crf as the finished mp4; zero-latency encoding costs little at this quality (the error is
    # mostly yuv420p's chroma subsampling, shared by both).
    stream_error = np.abs(frames.astype(int) - FRAMES).mean()
    assert stream_error < 1.1 * np.abs(finished.astype(int) - FRAMES).mean() + 0.2


def test_the_same_chunks_give_the_same_bytes():
    assert _write()[0] == _write()[0]  # one encoder thread, bitexact muxing
    whole, _ = _write([(0, 11)])  # chunking changes where fragments start, not the frames
    assert _decode(whole)[0].shape == FRAMES.shape


def test_bad_frames_are_refused_before_anything_is_written():
    out = io.BytesIO()
    writer = FragmentedMp4Writer(out, fps=8, width=48, height=32)
    with pytest.raises(ValueError, match=r"uint8 \[F, 32, 48, 3\]"):
        writer.write(FRAMES[:, :16])
    with pytest.raises(ValueError, match="uint8"):
        writer.write(FRAMES.astype(np.float32))
    assert out.getvalue() == b"" and writer.write(FRAMES[:0]) == 0
    writer.close()
    with pytest.raises(ValueError, match="even sizes"):
        FragmentedMp4Writer(io.BytesIO(), fps=8, width=47, height=32)
