"""Property tests (hypothesis) for request parsing: any body either parses or is a 400 / InvalidRequest naming a
field; form text comes back exactly as sent, or is refused; nothing else escapes (a TypeError is a 500)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from vidloom.core.errors import InvalidRequest, UnknownModel
from vidloom.media.request_inputs import resolve_request
from vidloom.families.wan.demo import demo_card
from vidloom.serving.chat_params import plan_chat
from vidloom.serving.chat_protocol import ChatCompletionBody
from vidloom.serving.errors import APIError
from vidloom.serving.form_body import MAX_FORM_FIELDS, read_form
from vidloom.serving.params import plan_images, plan_video
from vidloom.serving.protocol import ImageGenerationBody, VideoCreateBody
from vidloom.serving.request_body import validate_fields

PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=150)
CARD = demo_card()

NUMBERS = st.one_of(st.integers(), st.floats(), st.sampled_from([5e-324, 1e-300, 10**400, 2**64, -0.0, math.nan]))
TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["48x32", "true", "yes", "nan", "\x00", "\ud800", "euler"]))
VALUES = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=5)


def _body(fields: list[str], base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.one_of(st.sampled_from(fields), TEXT), VALUES, max_size=5).map(lambda o: {**base, **o})


def _outcome(parse: Any) -> Any:
    """The parsed value, or the refusal; any other exception fails the property."""
    try:
        return parse()
    except APIError as exc:
        assert exc.status == 400 and exc.code in ("invalid_parameter", "invalid_json"), exc.message
        return exc
    except (InvalidRequest, UnknownModel) as exc:
        return exc


@PROPERTY
@given(body=_body(sorted(VideoCreateBody.model_fields), {"prompt": "a cat", "size": "48x32", "num_frames": 5}))
def test_any_video_body_parses_plans_and_resolves_or_names_a_field(body: dict[str, Any]):
    parsed = _outcome(lambda: validate_fields(body, VideoCreateBody))
    if isinstance(parsed, VideoCreateBody):
        planned = _outcome(lambda: plan_video(parsed, CARD, max_frames=17))
        if not isinstance(planned, Exception):
            resolved = _outcome(lambda: resolve_request(planned.request, CARD))
            if not isinstance(resolved, Exception):  # what passes is a real request: finite, in range
                assert 0.01 <= resolved.flow_shift <= 100 and 0 <= resolved.guidance_scale <= 100


@PROPERTY
@given(body=_body(sorted(ImageGenerationBody.model_fields), {"prompt": "a cat", "size": "48x32"}))
def test_any_image_body_parses_and_plans_or_names_a_field(body: dict[str, Any]):
    parsed = _outcome(lambda: validate_fields(body, ImageGenerationBody))
    if isinstance(parsed, ImageGenerationBody):
        planned = _outcome(lambda: plan_images(parsed, CARD))
        if not isinstance(planned, Exception):
            for request in planned.requests:
                _outcome(lambda: resolve_request(request, CARD))


ROLES = st.one_of(st.sampled_from(["user", "system", "assistant", "developer"]), VALUES)
MESSAGES = st.lists(st.one_of(st.fixed_dictionaries({"role": ROLES, "content": st.one_of(TEXT, VALUES)}), VALUES),
                    max_size=3)


@PROPERTY
@given(body=_body(sorted(ChatCompletionBody.model_fields), {"messages": [{"role": "user", "content": "hi"}]}),
       messages=st.one_of(st.none(), MESSAGES))
def test_any_chat_body_parses_and_plans_or_names_a_field(body: dict[str, Any], messages: Any):
    import dataclasses

    from vidloom.core.card import LoopSpec

    chat_card = dataclasses.replace(CARD, loops={**CARD.loops, "ar_decode": LoopSpec()}, context_window=256)
    if messages is not None:
        body = {**body, "messages": messages}
    parsed = _outcome(lambda: validate_fields(body, ChatCompletionBody))
    if isinstance(parsed, ChatCompletionBody):
        planned = _outcome(lambda: plan_chat(parsed, chat_card))
        if not isinstance(planned, Exception):
            sampling = planned.request.sampling
            assert sampling.greedy or sampling.temperature >= 1e-5  # a temperature that divides safely


# -- the multipart parser ------------------------------------------------------------------------------------------

def _multipart(parts: list[tuple[bytes, bytes]]) -> bytes:
    out = b""
    for name, value in parts:
        out += b'--xyz\r\nContent-Disposition: form-data; name="' + name + b'"\r\n\r\n' + value + b"\r\n"
    return out + b"--xyz--\r\n"


def _parse(body: bytes) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/", "query_string": b"",
             "headers": [(b"content-type", b"multipart/form-data; boundary=xyz")]}
    return asyncio.run(read_form(Request(scope, receive)))


NAMES = st.text(st.characters(codec="utf-8", exclude_characters='"\r\n\\%'), min_size=1, max_size=6)
PART_VALUES = st.one_of(st.text(max_size=10).map(lambda t: t.encode("utf-8", "surrogatepass")),
                        st.binary(max_size=10).filter(lambda b: b"--xyz" not in b and not b.endswith(b"\r")))


@PROPERTY
@given(parts=st.lists(st.tuples(NAMES.map(str.encode), PART_VALUES), max_size=6))
def test_form_text_is_exactly_what_was_sent_or_a_400_naming_the_field(parts: list[tuple[bytes, bytes]]):
    try:
        form = _parse(_multipart(parts))
    except APIError as exc:
        bad = [name.decode() for name, value in parts if not _utf8(value)]
        assert exc.status == 400 and exc.code == "invalid_parameter" and exc.param == bad[0], exc.message
        return
    assert all(_utf8(value) for _, value in parts)
    assert form.multi_items() == [(name.decode(), value.decode()) for name, value in parts]


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_form_field_count_is_the_named_limit():
    parts = [(f"f{i}".encode(), b"1") for i in range(MAX_FORM_FIELDS)]
    assert len(_parse(_multipart(parts)).multi_items()) == MAX_FORM_FIELDS
    with pytest.raises(APIError, match="max_form_fields") as info:
        _parse(_multipart(parts + [(b"one_more", b"1")]))
    assert info.value.code == "limit_exceeded"


def test_an_empty_field_name_is_named_as_such():
    with pytest.raises(APIError) as exc:
        validate_fields({"prompt": "x", "": 1}, VideoCreateBody)
    assert exc.value.status == 400 and exc.value.message == "(empty field name): unknown parameter"
