"""Chat Completions bodies -> ChatRequest: what is accepted, and which field each refusal names."""

from __future__ import annotations

import base64
import dataclasses
import io

import pytest
from PIL import Image
from pydantic import ValidationError

from vidloom.core.card import LoopSpec
from vidloom.core.chat import ChatLimits
from vidloom.core.errors import InvalidRequest, UnknownModel
from vidloom.families.wan.demo import demo_card
from vidloom.serving.chat_params import plan_chat
from vidloom.serving.chat_protocol import ChatCompletionBody

VIDEO_CARD = demo_card()
CHAT_CARD = dataclasses.replace(VIDEO_CARD, loops={**VIDEO_CARD.loops, "ar_decode": LoopSpec()}, context_window=256)
LIMITS = ChatLimits(context_window=256, max_tokens=128, default_max_tokens=16)
HELLO = [{"role": "user", "content": "hello"}]


def plan(**fields):
    return plan_chat(ChatCompletionBody.model_validate({"messages": HELLO, **fields}), CHAT_CARD, LIMITS)


def field_of(**fields) -> str:
    with pytest.raises(InvalidRequest) as excinfo:
        plan(**fields)
    return excinfo.value.field


def _png_data_url() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 10)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_a_full_body_maps_onto_the_request():
    planned = plan(max_completion_tokens=7, temperature=0.5, top_p=0.9, top_k=5, seed=3, stop=["\n", "END"],
                   n=1, stream=True, stream_options={"include_usage": True}, user="u", frequency_penalty=0)
    s = planned.request.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed, s.stop) == (7, 0.5, 0.9, 5, 3, ("\n", "END"))
    assert planned.stream and planned.include_usage
    assert planned.request.request_id.startswith("chatcmpl-")
    assert [(m.role, m.text) for m in planned.request.messages] == [("user", "hello")]


def test_defaults_and_aliases():
    planned = plan(stop="END", top_k=-1)
    s = planned.request.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.stop) == (None, 1.0, 1.0, 0, ("END",))
    assert not planned.stream and not planned.include_usage
    assert plan(max_tokens=9).request.sampling.max_tokens == 9
    developer = plan(messages=[{"role": "developer", "content": "be brief"}, *HELLO])
    assert developer.request.messages[0].role == "system"


def test_content_parts_with_a_data_url_image():
    content = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": _png_data_url()}}]
    [message] = plan(messages=[{"role": "user", "content": content}]).request.messages
    assert [p.type for p in message.content] == ["text", "image"]
    assert message.content[1].image.size == (4, 3) and message.content[1].image.mode == "RGB"


@pytest.mark.parametrize(("fields", "field"), [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),  # unhashable: was a TypeError
    ({"messages": [{"role": {"name": "user"}, "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": None, "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": {"text": "x"}}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}]},
     "messages[0].content[0].image_url"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}]}]},
     "messages[0].content[0].image_url"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "/etc/passwd"}}]}]},
     "messages[0].content[0].image_url"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_tokens": 129}, "max_tokens"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"seed": -1}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": ["x" * 257]}, "stop[0]"),
    ({"stop": [""]}, "stop[0]"),
    ({"n": 2}, "n"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"logprobs": True}, "logprobs"),
])
def test_bad_input_names_the_field(fields, field):
    assert field_of(**fields) == field


def test_model_name_and_capability():
    with pytest.raises(UnknownModel):
        plan(model="gpt-4o")
    assert plan(model=CHAT_CARD.model_id).request.messages
    body = ChatCompletionBody.model_validate({"messages": HELLO})
    with pytest.raises(InvalidRequest) as excinfo:
        plan_chat(body, VIDEO_CARD, LIMITS)
    assert excinfo.value.field == "model" and "does not support chat" in excinfo.value.message


def test_media_parts_are_found_so_their_decoding_goes_to_the_media_pool():
    from vidloom.serving.chat_params import has_media_parts

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    text = {"type": "text", "text": "hi"}
    assert has_media_parts(ChatCompletionBody(messages=[{"role": "user", "content": [text, image]}]))
    assert not has_media_parts(ChatCompletionBody(messages=[{"role": "user", "content": [text]}]))
    assert not has_media_parts(ChatCompletionBody(messages=[{"role": "user", "content": "hi"}]))
    assert not has_media_parts(ChatCompletionBody(messages="not a list"))  # plan_chat names that problem
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    assert has_media_parts(ChatCompletionBody(messages=[{"role": "user", "content": [audio]}]))


@pytest.mark.parametrize("value", ["yes", "on", 1, 0, "True", "1"])
def test_booleans_are_true_or_false_only(value):
    # Pydantic's lax mode read "yes" as true; JSON true/false and a form's "true"/"false" are the only spellings.
    with pytest.raises(ValidationError, match="must be true or false"):
        ChatCompletionBody.model_validate({"messages": HELLO, "stream": value})
    assert ChatCompletionBody.model_validate({"messages": HELLO, "stream": "true"}).stream is True


def test_subnormal_temperature_plans_a_greedy_request():
    assert plan(temperature=5e-324).request.sampling.greedy
    assert field_of(temperature=2.5) == "temperature"
