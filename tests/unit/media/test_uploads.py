"""Upload files are checked from their headers before any pixel is decoded, and held compressed until decoded."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageFile

from tests.helpers.upload_bombs import png_claiming, uniform_h264
from vidloom.core.errors import InvalidRequest
from vidloom.media import uploads
from vidloom.media.image import EncodedImage, load_image, open_image, open_images
from vidloom.media.uploads import EncodedVideo, open_video
from vidloom.media.video import write_video


@pytest.fixture
def no_decoding(monkeypatch):
    """Any pixel decode (PIL's ImageFile.load) fails the test: what runs must be header-only."""

    def refuse(self):
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)


def _clip(tmp_path, frames: int, width: int = 16, height: int = 16) -> bytes:
    video = np.stack([np.full((height, width, 3), 10 * i, np.uint8) for i in range(frames)])
    return write_video(video, 8, tmp_path / "c.mp4").read_bytes()


@pytest.mark.parametrize("load", [load_image, open_image])
def test_a_png_claiming_100000_squared_is_refused_naming_the_limit(load):
    # PIL raises DecompressionBombError (not an OSError) past 2x its MAX_IMAGE_PIXELS: it was a 500.
    with pytest.raises(InvalidRequest, match="MAX_MEDIA_PIXELS") as err:
        load(png_claiming(100_000, 100_000), "input_reference")
    assert err.value.field == "input_reference"


@pytest.mark.parametrize("load", [load_image, open_image])
def test_an_oversized_png_is_refused_from_its_header_without_decoding(load, no_decoding):
    # 13000x13000 is under PIL's bomb limit: the old code decoded all 169 Mpx before refusing.
    with pytest.raises(InvalidRequest, match="13000x13000 is more than 16777216 pixels"):
        load(png_claiming(13_000, 13_000), "image")


def test_open_image_keeps_the_file_until_decoded(monkeypatch):
    buffer = io.BytesIO()
    Image.new("RGBA", (40, 30), (1, 2, 3, 4)).save(buffer, format="PNG")
    with monkeypatch.context() as patched:
        patched.setattr(ImageFile.ImageFile, "load", lambda self: pytest.fail("decoded at open"))
        encoded, = open_images(buffer.getvalue(), "image")
    assert isinstance(encoded, EncodedImage) and encoded.size == (40, 30)
    assert encoded.source == buffer.getvalue()  # the compressed bytes, nothing more
    decoded = load_image(encoded, "image")
    assert decoded.mode == "RGB" and decoded.getpixel((0, 0)) == (1, 2, 3)


def test_a_broken_image_past_its_header_fails_when_decoded_naming_the_field():
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)).save(buffer, format="PNG")
    data = buffer.getvalue()[:2000]  # the header is fine, the pixel data is cut off
    encoded = open_image(data, "last_image")
    with pytest.raises(InvalidRequest, match="not a readable image") as err:
        encoded.decode()
    assert err.value.field == "last_image"


def test_a_video_bomb_is_counted_from_its_container_not_decoded():
    bomb = uniform_h264(2048, 2048, 77)  # 16 KB that decode to 970 MB: the file
    assert len(bomb) < 64_000
    video = open_video(bomb, "video")
    assert isinstance(video, EncodedVideo) and (video.size, len(video)) == ((2048, 2048), 77)
    with pytest.raises(InvalidRequest, match="more than 33 frames \\(max_frames\\)") as err:
        open_video(bomb, "video", max_frames=33)
    assert err.value.field == "video"
    # Decoded by the job, each frame lands at the request's size as it comes (never 77 full frames at once).
    frames = video.decode((64, 48))
    assert len(frames) == 77 and {f.size for f in frames} == {(64, 48)}


def test_video_limits_from_the_header(tmp_path, monkeypatch):
    clip = _clip(tmp_path, 9)
    monkeypatch.setattr(uploads, "MAX_MEDIA_PIXELS", 15 * 15)
    with pytest.raises(InvalidRequest, match="16x16 frames, more than 225 pixels each \\(MAX_MEDIA_PIXELS\\)"):
        open_video(clip, "video")
    monkeypatch.setattr(uploads, "MAX_MEDIA_PIXELS", 16 * 16)
    monkeypatch.setattr(uploads, "MAX_VIDEO_PIXELS", 8 * 16 * 16)  # frames x pixels: 9 frames are one too many
    with pytest.raises(InvalidRequest, match="MAX_VIDEO_PIXELS"):
        open_video(clip, "video")
    with pytest.raises(InvalidRequest, match="at least 10 are needed"):
        open_video(_clip(tmp_path, 5), "video", min_frames=10)


def test_decoding_stops_at_the_checked_count_and_names_a_short_file(tmp_path):
    clip = _clip(tmp_path, 7)
    assert len(EncodedVideo(clip, (16, 16), 3, "video").decode()) == 3  # the running count stops there
    with pytest.raises(InvalidRequest, match="decoded to 7 frames but its container holds 9"):
        EncodedVideo(clip, (16, 16), 9, "video").decode()
    with pytest.raises(InvalidRequest, match="frame 0 is 16x16 but the stream header says 32x32"):
        EncodedVideo(clip, (32, 32), 7, "video").decode()


def test_unreadable_videos_name_the_field(tmp_path):
    for data in (b"\x00\x01 not an mp4", _clip(tmp_path, 5)[:200]):
        with pytest.raises(InvalidRequest, match="not a readable video|has no") as err:
            open_video(data, "video")
        assert err.value.field == "video"
