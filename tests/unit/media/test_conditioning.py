"""Conditioning frames and clips: PIL, arrays and paths become uint8 RGB arrays; bad input names the field."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vidloom.core.errors import InvalidRequest
from vidloom.media.conditioning import fit_image, load_frame, load_video


def test_sources_agree(tmp_path):
    array = (np.arange(16 * 24 * 3) % 251).astype(np.uint8).reshape(16, 24, 3)
    path = tmp_path / "frame.png"
    Image.fromarray(array).save(path)
    for source in (array, Image.fromarray(array), path, str(path), array.astype(np.float32) / 255):
        assert np.array_equal(load_frame(source), array)


def test_resizes_to_the_requested_size():
    out = load_frame(np.zeros((16, 24, 3), np.uint8), size=(48, 32))
    assert out.shape == (32, 48, 3) and out.dtype == np.uint8


@pytest.mark.parametrize("bad", [np.zeros((4, 4), np.uint8), np.full((4, 4, 3), np.nan), np.zeros((4, 4, 3), np.int64), 3])
def test_bad_images_raise_invalid_request(bad):
    with pytest.raises(InvalidRequest) as err:
        load_frame(bad)
    assert err.value.field == "image"


def test_unreadable_path_raises_invalid_request(tmp_path):
    with pytest.raises(InvalidRequest, match="no such image file"):
        load_frame(tmp_path / "missing.png")


def test_fit_image_resizes_only_when_the_size_differs():
    image = Image.new("RGB", (24, 16))
    assert fit_image(image, (24, 16)) is image
    assert fit_image(image, (48, 32)).size == (48, 32)


def test_video_sources_agree(tmp_path):
    from vidloom.media.video import write_video

    frames = np.zeros((5, 16, 24, 3), np.uint8)
    frames[:, :, :12] = 200
    assert np.array_equal(load_video(frames), frames)
    assert np.array_equal(load_video([Image.fromarray(f) for f in frames]), frames)
    path = write_video(frames, 8, tmp_path / "ctx.mp4")
    decoded = load_video(path)
    assert decoded.shape == frames.shape and np.abs(decoded.astype(int) - frames).mean() < 8  # lossy codec
    assert load_video(frames, size=(48, 32)).shape == (5, 32, 48, 3)


@pytest.mark.parametrize("bad", [[], np.zeros((4, 4, 3), np.uint8), [np.zeros((4, 4, 3), np.uint8), np.zeros((4, 5, 3), np.uint8)]])
def test_bad_videos_raise_invalid_request(bad):
    with pytest.raises(InvalidRequest) as err:
        load_video(bad)
    assert err.value.field == "video"
