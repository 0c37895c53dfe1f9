"""A chat's media sized from their headers, and admitted per chat and across chats, before any part is decoded
(#40)."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

import vidloom.media.audio_upload as audio_upload
from tests.helpers.audio_containers import encoded_audio
from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.serving.chat_media import ChatMediaAdmission, chat_media_bytes
from vidloom.serving.errors import APIError


def _audio(data: bytes, fmt: str) -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def _png(width: int, height: int) -> dict:
    out = io.BytesIO()
    Image.new("RGB", (width, height)).save(out, format="PNG")
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()}}


@pytest.fixture
def no_decoding(monkeypatch):
    """Call it once the inputs are encoded: decoding audio or pixels then fails."""
    def fail(*args, **kwargs):
        raise AssertionError("a part was decoded")

    def block() -> None:
        monkeypatch.setattr(audio_upload, "_resampled", fail)
        monkeypatch.setattr(Image.Image, "load", fail)

    return block


def test_the_decoded_size_comes_from_the_headers(no_decoding):
    mp3 = encoded_audio("mp3", seconds=29.0, rate=8000, bit_rate=8000)  # 29 KB that decode to 29 s
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}, _audio(mp3, "mp3"), _png(40, 30)]},
                {"role": "user", "content": [_audio(mp3, "mp3")]}]
    no_decoding()
    assert chat_media_bytes(messages) == 2 * 29 * 16000 * 4 + 40 * 30 * 3


def test_malformed_parts_are_left_to_planning_to_name():
    messages = [{"role": "user", "content": [{"type": "input_audio", "input_audio": "not an object"},
                                             {"type": "input_audio", "input_audio": {"data": 3, "format": "wav"}},
                                             {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                                             "text"]}, "not a message"]
    assert chat_media_bytes(messages) == 0


def test_a_part_in_another_format_is_named_before_anything_is_summed(no_decoding):
    messages = [{"role": "user", "content": [_audio(encoded_audio("flac"), "wav")]}]
    no_decoding()
    with pytest.raises(InvalidRequest, match="does not start like a wav file") as info:
        chat_media_bytes(messages)
    assert info.value.field == "messages[0].content[0].input_audio"


def test_one_chat_over_its_limit_is_a_400_naming_messages():
    admission = ChatMediaAdmission(per_chat_bytes=1000, budget_bytes=10_000)
    with pytest.raises(LimitExceeded) as info:
        with admission.admitted(1001):
            pass
    assert info.value.field == "messages" and info.value.limit == "max_chat_media_bytes"


def test_chats_past_the_budget_wait_for_a_429_and_the_bytes_come_back():
    admission = ChatMediaAdmission(per_chat_bytes=1000, budget_bytes=1500)
    with admission.admitted(1000):
        with pytest.raises(APIError) as info:
            with admission.admitted(600):
                pass
        assert info.value.status == 429 and info.value.code == "media_busy"
        assert "chat_media_budget_bytes" in info.value.message and info.value.headers["Retry-After"]
        with admission.admitted(500):
            assert admission.ledger.in_use == 1500
    assert admission.ledger.in_use == 0
    with pytest.raises(RuntimeError):
        with admission.admitted(1000):
            raise RuntimeError("planning failed")
    assert admission.ledger.in_use == 0  # released on failure too


def test_a_video_is_sized_from_its_headers_as_its_sampled_frames_and_sound(no_decoding):
    """2 s of 80x64 at 4 fps: 5 frames sampled at 2 fps (the estimate rounds up), 2 s of 16 kHz float32 sound only
    when use_audio_in_video; nothing is decoded, and a file that is no video names its part."""
    from tests.helpers.chat_videos import video_bytes, video_part

    data = video_bytes(1, frames=8, size=(80, 64), fps=4, sound=True)
    no_decoding()
    silent = chat_media_bytes([{"role": "user", "content": [video_part(data)]}])
    heard = chat_media_bytes([{"role": "user", "content": [video_part(data, use_audio=True)]}])
    assert silent == 5 * 80 * 64 * 3
    assert 2 * 16000 * 4 <= heard - silent <= 2.1 * 16000 * 4  # the AAC track's header may count its padding
    with pytest.raises(InvalidRequest) as err:
        chat_media_bytes([{"role": "user", "content": ["x", video_part(b"nope" * 40)]}])
    assert err.value.field == "messages[0].content[1].video_url"
