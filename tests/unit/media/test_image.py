"""Conditioning media at the boundary: what load_image / load_video accept, and errors naming the field."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from vidloom.core.errors import InvalidRequest
from vidloom.media.image import image_to_tensor, load_image
from vidloom.media.uploads import load_video


def _png_bytes(mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (8, 6)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("value", [
    Image.new("RGBA", (8, 6)), Image.new("L", (8, 6)), Image.new("P", (8, 6)),
    np.zeros((6, 8, 3), np.uint8), np.zeros((6, 8), np.uint8), np.full((6, 8, 3), 0.5, np.float32),
    _png_bytes(),
])
def test_accepted_images_become_rgb(value):
    image = load_image(value, "image")
    assert image.mode == "RGB" and image.size == (8, 6)


def test_path_images_load(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(_png_bytes())
    assert load_image(str(path), "last_image").size == (8, 6)


@pytest.mark.parametrize(("value", "message"), [
    (Image.new("F", (8, 6)), "mode 'F'"),  # a float image: no unambiguous RGB rendering
    (Image.new("I;16", (8, 6)), "mode 'I;16'"),
    (np.zeros((6, 8, 5), np.uint8), "HxWx3"),
    (np.full((6, 8, 3), 2.0, np.float32), "in \\[0, 1\\]"),
    (np.zeros((6, 8, 3), np.int64), "uint8 or float"),
    (b"definitely not an image", "not a readable image"),
    ("/no/such/file.png", "does not exist"),
    (42, "PIL image"),
])
def test_bad_images_name_the_field(value, message):
    with pytest.raises(InvalidRequest, match=message) as err:
        load_image(value, "input_reference")
    assert err.value.field == "input_reference"


def test_video_frames_and_errors():
    frames = [np.zeros((6, 8, 3), np.uint8)] * 5
    assert len(load_video(frames, "video", min_frames=5)) == 5
    assert len(load_video(np.zeros((5, 6, 8, 3), np.uint8), "video")) == 5
    with pytest.raises(InvalidRequest, match="at least 5") as err:
        load_video(frames[:2], "video", min_frames=5)
    assert err.value.field == "video"
    with pytest.raises(InvalidRequest, match="video\\[1\\]"):  # a bad frame is named by index
        load_video([frames[0], np.zeros((6, 8, 7), np.uint8)], "video")
    with pytest.raises(InvalidRequest, match="not a readable video"):
        load_video(b"\x00\x01 not an mp4", "video")


def test_image_to_tensor_resizes_and_scales_like_diffusers():
    image = Image.fromarray(np.array([[[0, 255, 128]] * 4] * 2, np.uint8))  # 4x2, one colour
    tensor = image_to_tensor(image, 6, 10)
    assert tensor.shape == (3, 6, 10)
    assert tensor[:, 0, 0].tolist() == pytest.approx([-1.0, 1.0, 128 / 255 * 2 - 1], abs=1e-6)


def test_decoding_stops_at_the_limits(tmp_path):
    from vidloom.media.image import MAX_MEDIA_PIXELS
    from vidloom.media.video import write_video

    clip = write_video(np.zeros((7, 16, 16, 3), np.uint8), 8, tmp_path / "c.mp4").read_bytes()
    assert len(load_video(clip, "video", max_frames=7)) == 7
    with pytest.raises(InvalidRequest, match="more than 5 frames") as err:
        load_video(clip, "video", max_frames=5)
    assert err.value.field == "video"
    side = int(MAX_MEDIA_PIXELS**0.5) + 1
    with pytest.raises(InvalidRequest, match="MAX_MEDIA_PIXELS"):
        load_image(Image.new("L", (side, side)), "image")
