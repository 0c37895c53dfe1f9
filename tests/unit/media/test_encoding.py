"""mp4/png writers: the pixel format and quality players and users rely on, lossless PNG, input checks."""

from __future__ import annotations

import av
import numpy as np
import pytest

from vidloom.media.video import read_video, write_png, write_video

FRAMES = np.random.default_rng(1).integers(0, 256, (3, 16, 32, 3), dtype=np.uint8)


def test_mp4_is_h264_yuv420p_at_the_requested_quality(tmp_path):
    fine, coarse = tmp_path / "a" / "b" / "fine.mp4", tmp_path / "coarse.mp4"  # missing folders are created
    write_video(FRAMES, 8, fine)
    write_video(FRAMES, 8, coarse, crf=45)
    with av.open(str(fine)) as container:
        stream = container.streams.video[0]
        # yuv420p: the only H.264 profile every browser and phone plays
        assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
    assert coarse.stat().st_size < fine.stat().st_size  # crf reaches the encoder
    frames, fps = read_video(fine)
    assert frames.shape == FRAMES.shape and fps == 8


def test_png_is_lossless(tmp_path):
    path = write_png(FRAMES[0], tmp_path / "frame.png")
    with av.open(str(path)) as container:
        decoded = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert np.array_equal(decoded, FRAMES[0])


@pytest.mark.parametrize(
    "frames, match",
    [
        (FRAMES.astype(np.float32), "must be uint8"),
        (FRAMES[0], "must be uint8"),
        (FRAMES[..., :2], "must be uint8"),
        (FRAMES[:, :15], "even sizes"),
        (FRAMES[:, :, :31], "even sizes"),
    ],
)
def test_write_video_refuses_bad_frames(tmp_path, frames, match):
    with pytest.raises(ValueError, match=match):
        write_video(frames, 8, tmp_path / "x.mp4")
    assert list(tmp_path.iterdir()) == []
