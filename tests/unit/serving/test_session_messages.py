"""The WebSocket's action messages and handshake checks, without a server: each refusal names its field."""

from __future__ import annotations

import numpy as np
import pytest

from vidloom.core.errors import InvalidRequest
from vidloom.serving.config import ServeConfig
from vidloom.serving.guard import RequestGuard
from vidloom.serving.session_routes import encode_frames, parse_message


def test_action_rows_parse_and_policy_takes_none():
    assert parse_message({"text": '{"actions": [[0.5, -1], [0, 2.5e-1]]}'}) == [[0.5, -1], [0, 0.25]]
    assert parse_message({"text": "{}"}) is None and parse_message({"text": '{"actions": null}'}) is None


@pytest.mark.parametrize("message, field", [
    ({"bytes": b"\x00"}, "message"), ({"text": "left"}, "message"), ({"text": "[[1, 2]]"}, "message"),
    ({"text": '{"actions": [[NaN, 1]]}'}, "message"), ({"text": '{"actions": [[Infinity, 1]]}'}, "message"),
    ({"text": '{"actions": [[1e999, 1]]}'}, "actions[0]"), ({"text": '{"actions": [[1, 2], [3]]}'}, "actions[1]"),
    ({"text": '{"actions": [[true, 1]]}'}, "actions[0]"), ({"text": '{"actions": [["1", 1]]}'}, "actions[0]"),
    ({"text": '{"actions": []}'}, "actions"), ({"text": '{"actions": [[]]}'}, "actions"),
    ({"text": '{"actions": [1, 2]}'}, "actions"), ({"text": '{"act": [[1]]}'}, "act"),
    ({"text": "[" * 100000}, "message"), ({"text": " " * (2 << 20)}, "message"),
    ({"text": '{"actions": [[1' + "0" * 400 + ', 1]]}'}, "actions[0]"),  # overflows a float
    ({"text": '{"\\ud800": [[1]]}'}, "message"),  # a lone surrogate as a field name, never echoed
    ({"text": '{"actions": [[1]], "\\u0000": 1}'}, "message"),
])
def test_bad_messages_name_the_field(message: dict, field: str):
    with pytest.raises(InvalidRequest) as exc:
        parse_message(message)
    assert exc.value.field == field


def test_an_empty_field_name_is_named_as_such():
    with pytest.raises(InvalidRequest) as exc:
        parse_message({"text": '{"actions": [[1]], "": 1}'})
    assert exc.value.field == "message" and "(empty field name)" in exc.value.message


def test_frames_encode_one_image_per_frame():
    frames = np.random.default_rng(0).integers(0, 256, (3, 8, 12, 3), dtype=np.uint8)
    jpegs, pngs = encode_frames(frames, "jpeg"), encode_frames(frames, "png")
    assert len(jpegs) == len(pngs) == 3
    assert all(j.startswith(b"\xff\xd8") for j in jpegs) and all(p.startswith(b"\x89PNG") for p in pngs)


def _scope(headers: dict[str, str], query: str = "", subprotocols: tuple[str, ...] = ()) -> dict:
    return {"type": "websocket", "path": "/v1/sessions/s/ws", "query_string": query.encode(),
            "subprotocols": list(subprotocols),
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}


def test_websocket_handshakes_need_the_key_and_an_allowed_origin():
    guard = RequestGuard(lambda *a: None, ServeConfig(api_key="sk-1", cors_origins=("https://app.example",)))
    host = {"host": "127.0.0.1:8000"}
    assert guard.admits_websocket(_scope({**host, "authorization": "Bearer sk-1"}))
    assert guard.admits_websocket(_scope(host, "api_key=sk-1"))
    assert guard.admits_websocket(_scope(host, subprotocols=("vidloom", "bearer.sk-1")))
    assert not guard.admits_websocket(_scope(host))
    assert not guard.admits_websocket(_scope(host, "api_key=sk-2"))
    assert not guard.admits_websocket(_scope(host, subprotocols=("bearer.sk-2",)))
    keyed = {**host, "authorization": "Bearer sk-1"}
    assert guard.admits_websocket(_scope({**keyed, "origin": "https://app.example"}))
    assert guard.admits_websocket(_scope({**keyed, "origin": "http://127.0.0.1:8000"}))  # same origin
    assert not guard.admits_websocket(_scope({**keyed, "origin": "https://evil.example"}))
    open_guard = RequestGuard(lambda *a: None, ServeConfig())
    assert open_guard.admits_websocket(_scope(host))
    assert not open_guard.admits_websocket(_scope({**host, "origin": "https://evil.example"}))
