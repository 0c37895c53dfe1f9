"""Chat contracts: validation names the field a caller must fix; OpenAI-style messages convert."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from vidloom.core.chat import (ChatLimits, ChatMessage, ChatPart, ChatRequest, SamplingParams, messages_from_openai,
                               stop_tuple)
from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.core.speech import voice_from_openai
from vidloom.media.image import load_image

LIMITS = ChatLimits(context_window=64, max_tokens=32, default_max_tokens=16, max_stop=2, max_stop_chars=5,
                    max_prompt_chars=20)


def _user(text: str = "hi") -> ChatMessage:
    return ChatMessage("user", (ChatPart("text", text=text),))


def _field(exc: pytest.ExceptionInfo) -> str:
    return exc.value.field


@pytest.mark.parametrize("params, field", [
    (SamplingParams(max_tokens=0), "max_tokens"),
    (SamplingParams(max_tokens=True), "max_tokens"),
    (SamplingParams(temperature=-0.1), "temperature"),
    (SamplingParams(temperature=float("nan")), "temperature"),
    (SamplingParams(temperature=2.5), "temperature"),
    (SamplingParams(top_p=0.0), "top_p"),
    (SamplingParams(top_p=1.01), "top_p"),
    (SamplingParams(top_k=-1), "top_k"),
    (SamplingParams(top_k=1.5), "top_k"),
    (SamplingParams(seed=-1), "seed"),
    (SamplingParams(seed=2**64), "seed"),
    (SamplingParams(stop=("",)), "stop[0]"),
    (SamplingParams(stop=("a", 3)), "stop[1]"),
    (SamplingParams(stop=["a"]), "stop"),
])
def test_sampling_validation_names_the_field(params: SamplingParams, field: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        params.validate()
    assert _field(exc) == field


@pytest.mark.parametrize("params, field, limit", [
    (SamplingParams(max_tokens=33), "max_tokens", "max_tokens"),
    (SamplingParams(stop=("a", "b", "c")), "stop", "max_stop"),
    (SamplingParams(stop=("abcdef",)), "stop[0]", "max_stop_chars"),
])
def test_sampling_limits_name_the_setting(params: SamplingParams, field: str, limit: str) -> None:
    params.validate()  # fine without limits
    with pytest.raises(LimitExceeded) as exc:
        params.validate(LIMITS)
    assert (exc.value.field, exc.value.limit) == (field, limit)


def test_valid_sampling_passes() -> None:
    SamplingParams(max_tokens=32, temperature=0, top_p=1.0, top_k=5, seed=2**64 - 1, stop=("ab", "c")).validate(LIMITS)


def test_completion_budget() -> None:
    assert SamplingParams().completion_budget(10, LIMITS) == 16  # the default
    assert SamplingParams().completion_budget(60, LIMITS) == 4  # what the window has left
    assert SamplingParams(max_tokens=20).completion_budget(44, LIMITS) == 20
    with pytest.raises(LimitExceeded) as exc:
        SamplingParams(max_tokens=21).completion_budget(44, LIMITS)
    assert (exc.value.field, exc.value.limit) == ("max_tokens", "context_window")
    with pytest.raises(LimitExceeded) as exc:
        SamplingParams().completion_budget(64, LIMITS)
    assert exc.value.field == "messages"


@pytest.mark.parametrize("messages, field", [
    ((), "messages"),
    ([_user()], "messages"),
    ((ChatMessage("tool", (ChatPart("text", text="x"),)),), "messages[0].role"),
    ((_user(), ChatMessage("robot", ())), "messages[1].role"),
    ((ChatMessage("user", [ChatPart("text", text="x")]),), "messages[0].content"),
    ((ChatMessage("user", (ChatPart("file"),)),), "messages[0].content[0].type"),
    ((ChatMessage("user", (ChatPart("video"),)),), "messages[0].content[0].video"),
    ((ChatMessage("user", (ChatPart("audio"),)),), "messages[0].content[0].audio"),
    ((ChatMessage("user", (ChatPart("audio", audio=np.zeros(4, np.float32)),)),), "messages[0].content[0].sample_rate"),
    ((ChatMessage("assistant", (ChatPart("audio", audio=np.zeros(4, np.float32), sample_rate=16000),)),),
     "messages[0].content[0].type"),
    ((ChatMessage("user", (ChatPart("image"),)),), "messages[0].content[0].image"),
    ((ChatMessage("system", (ChatPart("image", image=Image.new("RGB", (4, 4))),)),), "messages[0].content[0].type"),
    ((ChatMessage("user", (ChatPart("text", text=5),)),), "messages[0].content[0].text"),
    ((ChatMessage("user", (ChatPart("text", text="a\ud800"),)),), "messages[0].content[0].text"),
    (("hello",), "messages[0]"),
])
def test_message_validation_names_the_field(messages: object, field: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        ChatRequest(messages).validate()  # type: ignore[arg-type]
    assert _field(exc) == field


def test_prompt_chars_limit() -> None:
    ChatRequest((_user("x" * 20),)).validate(LIMITS)
    with pytest.raises(LimitExceeded) as exc:
        ChatRequest((_user("x" * 11), _user("y" * 10))).validate(LIMITS)
    assert (exc.value.field, exc.value.limit) == ("messages", "max_prompt_chars")


def test_request_ids_are_unique() -> None:
    assert ChatRequest((_user(),)).request_id != ChatRequest((_user(),)).request_id


def _png_data_url() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (3, 2), (255, 0, 0)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_messages_from_openai() -> None:
    msgs = messages_from_openai([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is"},
                                     {"type": "image_url", "image_url": {"url": _png_data_url()}}]},
        _user("again"),
    ], load_image)
    assert [m.role for m in msgs] == ["system", "user", "user"]
    assert msgs[0].text == "be brief" and msgs[1].text == "what is"
    image = msgs[1].content[1].image
    assert image is not None and image.size == (3, 2) and image.getpixel((0, 0)) == (255, 0, 0)
    ChatRequest(msgs).validate()


@pytest.mark.parametrize("messages, field", [
    ([], "messages"),
    ("hi", "messages"),
    ([{"role": "bot", "content": "x"}], "messages[0].role"),
    ([{"content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "video"}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}],
     "messages[0].content[0].image_url"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}]}],
     "messages[0].content[0].image_url"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
     "messages[0].content[0].image_url"),
    ([{"role": "user", "content": "x"}, 3], "messages[1]"),
    ([{"role": "user", "content": []}], "messages[0].content"),  # accepted as nothing before
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav",
                                                                           "sample_rate": 8000}}]}],
     "messages[0].content[0].input_audio"),  # an extra key was ignored
])
def test_messages_from_openai_errors_name_the_field(messages: object, field: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        messages_from_openai(messages, load_image)
    assert _field(exc) == field


def test_images_refused_without_a_loader() -> None:
    with pytest.raises(InvalidRequest, match="does not accept images"):
        messages_from_openai([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}])


def test_stop_tuple() -> None:
    assert stop_tuple(None) == () and stop_tuple("x") == ("x",) and stop_tuple(["a", "b"]) == ("a", "b")
    with pytest.raises(InvalidRequest) as exc:
        stop_tuple(3)  # type: ignore[arg-type]
    assert _field(exc) == "stop"


@pytest.mark.parametrize("value, voice", [("Ethan", "Ethan"), ({"id": "Chelsie"}, "Chelsie"), (None, None)])
def test_voices_are_a_name_or_an_id_object(value: object, voice: str | None) -> None:
    assert voice_from_openai(value, "voice") == voice


@pytest.mark.parametrize("value", [{}, {"name": "Ethan"}, {"id": "Ethan", "style": "calm"}, {"id": 3}, 3, ["Ethan"]])
def test_other_voices_are_refused_not_replaced_by_the_default(value: object) -> None:
    with pytest.raises(InvalidRequest) as exc:
        voice_from_openai(value, "audio.voice")
    assert exc.value.field == "audio.voice"
