"""Unreadable uploads are refused naming their field, never the server's temporary copy or a Python object."""

from __future__ import annotations

import re
import tempfile

import pytest

from vidloom.core.errors import InvalidRequest
from vidloom.media.audio_upload import load_input_audio, open_audio_upload
from vidloom.media.decode_errors import decode_reason
from vidloom.media.image import load_image
from vidloom.media.uploads import open_video

GARBAGE = b"not a media file " * 40
PART = "messages[0].content[0].input_audio"
BAD_WAV = b"RIFF\x00\x00\x00\x00WAVEfmt " + b"\x00" * 100


@pytest.mark.parametrize("load, field", [
    (lambda: load_input_audio(GARBAGE, "mp3", PART), PART),
    (lambda: load_input_audio(BAD_WAV, "wav", PART), PART),
    (lambda: open_audio_upload(GARBAGE, "init_audio", 16000, 10.0), "init_audio"),
    (lambda: load_image(GARBAGE, "input_reference"), "input_reference"),
    (lambda: load_image(b"\x89PNG\r\n\x1a\n" + b"\x00" * 50, "input_reference"), "input_reference"),
    (lambda: open_video(GARBAGE, "video"), "video"),
])
def test_unreadable_uploads_name_the_field_and_no_temporary_path_or_object(load, field):
    with pytest.raises(InvalidRequest) as err:
        load()
    assert err.value.field == field
    text = str(err.value)
    assert tempfile.gettempdir() not in text and "vidloom-upload" not in text, text
    assert re.search(r"0x[0-9a-fA-F]{4,}", text) is None, text  # an object's address


def test_decode_reason_keeps_the_reason_only(tmp_path):
    assert decode_reason(OSError(1094995529, "Invalid data found", str(tmp_path / "input.wav"))) == "Invalid data found"
    assert decode_reason(OSError("cannot identify image file <_io.BytesIO object at 0x7f00aa>")) == \
        "cannot identify image file"
    assert decode_reason(ValueError(f"{tmp_path / 'clip'}: 8-bit WAV"), tmp_path / "clip") == "8-bit WAV"
