"""Uploaded images and videos open only as the formats their fields take, before any other parser runs (#40)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tests.helpers.upload_bombs import uniform_h264
from vidloom.core.errors import InvalidRequest
from vidloom.media.image import open_image
from vidloom.media.uploads import open_video


def _image(fmt: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 6), (10, 20, 30)).save(out, format=fmt)
    return out.getvalue()


def _video(container: str, codec: str) -> bytes:
    import av

    out = io.BytesIO()
    frame = av.VideoFrame.from_ndarray(np.full((16, 16, 3), 90, np.uint8), format="rgb24")
    with av.open(out, "w", format=container) as muxer:
        stream = muxer.add_stream(codec, rate=8)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        for _ in range(3):
            for packet in stream.encode(frame):
                muxer.mux(packet)
        for packet in stream.encode(None):
            muxer.mux(packet)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_png_jpeg_and_webp_uploads_open(fmt):
    assert open_image(_image(fmt), "input_reference").size == (8, 6)


@pytest.mark.parametrize("fmt", ["BMP", "TIFF", "GIF", "PPM", "ICO"])
def test_other_image_formats_are_refused_as_uploads(fmt):
    with pytest.raises(InvalidRequest, match=r"the upload is not a readable image \(this server reads PNG, JPEG, "
                                             "WEBP uploads\\)") as info:
        open_image(_image(fmt), "input_reference")
    assert info.value.field == "input_reference"


def test_a_local_image_file_may_be_any_format_pil_reads(tmp_path):
    """The Python API and the CLI open a caller's own files as before: only uploads are restricted."""
    path = tmp_path / "still.bmp"
    path.write_bytes(_image("BMP"))
    assert open_image(path, "image").size == (8, 6)


def test_h264_mp4_and_vp9_webm_uploads_open():
    assert len(open_video(uniform_h264(16, 16, 4), "video")) == 4
    assert len(open_video(_video("webm", "libvpx-vp9"), "video")) == 3


@pytest.mark.parametrize("container, codec", [("avi", "mpeg4"), ("mpegts", "mpeg2video"), ("gif", "gif")])
def test_other_video_containers_are_refused_before_any_demuxer(container, codec, monkeypatch):
    import av

    data = _video(container, codec) if codec != "gif" else _gif()
    monkeypatch.setattr(av, "open", lambda *a, **k: pytest.fail("a demuxer was opened"))
    with pytest.raises(InvalidRequest, match="is not a readable video .*none of the mp4, webm") as info:
        open_video(data, "video")
    assert info.value.field == "video"


def test_an_mp4_of_another_codec_is_refused_by_its_codec():
    with pytest.raises(InvalidRequest, match="holds 'mpeg4' data; a mp4 upload may hold .*h264"):
        open_video(_video("mp4", "mpeg4"), "video")


def _gif() -> bytes:
    out = io.BytesIO()
    frames = [Image.new("RGB", (16, 16), (i * 40, 0, 0)) for i in range(3)]
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])
    return out.getvalue()
