"""A hypothesis-driven WebSocket client for the world-model session protocol (cosmos3-action-demo): hostile
messages (wrong types, huge numbers, lone surrogates, deep JSON, unknown fields, oversized text, binary frames)
each get an error message naming a field, and the session stays usable: a valid chunk afterwards still runs.
Never a dead socket, never a dead session.

Deterministic (derandomized hypothesis, no example database) and bounded: a new session per example, a handful
of messages each, a tiny demo whose chunk runs in well under a second.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from tests.helpers.api_fuzz import FUZZ
from tests.helpers.servers import ThreadServer
from tests.integration.test_api_fuzz_models import OPEN
from vidloom.serving.config import ServeConfig
from vidloom.serving.session_routes import MAX_MESSAGE_CHARS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
SESSIONS = settings(FUZZ, max_examples=12)
VALID = json.dumps({"actions": [[0.5, -0.5]] * 4})  # pusht actions are 2 wide; chunk_size 4


@pytest.fixture(scope="module")
def server(demo_cache, tmp_path_factory) -> Iterator[ThreadServer]:
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    engine = VideoGenerator.from_pretrained("cosmos3-action-demo", device="cpu", cache_dir=demo_cache,
                                            deploy=DeployConfig(kv_session_ttl_s=600)).engine
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("fuzz-ws"), graceful_shutdown_s=1)
    with ThreadServer(engine, config) as running:
        yield running


# -- hostile messages -------------------------------------------------------------------------------------------------

NUMBERS = st.one_of(st.integers(-3, 3), st.integers(), st.floats(),
                    st.sampled_from([5e-324, 1e308, 2**64, 10**400, -(10**400), 0.5, -1.0]))
TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["", "\ud800", "\udfff", "\x00", "actions", "left", "nan"]))
VALUES = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=3),
                      max_leaves=12)
ROWS = st.lists(st.one_of(st.lists(NUMBERS, min_size=2, max_size=2), st.lists(NUMBERS, max_size=4), VALUES),
                min_size=1, max_size=6)
OBJECTS = st.one_of(
    st.fixed_dictionaries({"actions": st.one_of(ROWS, VALUES)}),
    st.fixed_dictionaries({"actions": ROWS}, optional={"speed": VALUES, "\ud800": VALUES, "": VALUES}),
    st.dictionaries(TEXT, VALUES, max_size=3),
)


def _json(value: Any) -> str:
    """JSON text with NaN / Infinity literals, 10**400 as its digits and lone surrogates as \\ud800 escapes."""
    return json.dumps(value, allow_nan=True)  # ensure_ascii: every surrogate leaves as an escape


TEXT_MESSAGES = st.one_of(
    OBJECTS.map(_json), VALUES.map(_json),
    st.text(max_size=20).filter(lambda t: t.encode("utf-8", "surrogatepass").decode("utf-8", "replace") == t),
    st.sampled_from(["", "{", "null", "[]", "1e999", "[" * 100_000, '{"actions": ' + "[" * 50_000,
                     '{"actions": [[NaN, Infinity]]}', '{"actions": [[1' + "0" * 5000 + ", 0]]}",
                     '{"actions": [[0.5, 0.5]], "actions": "x"}', '{"\\ud800": 1}', '{"actions": "\\u0000"}',
                     "x" * (MAX_MESSAGE_CHARS + 1)]),
)
MESSAGES = st.lists(st.one_of(TEXT_MESSAGES, TEXT_MESSAGES, st.binary(max_size=32)), min_size=1, max_size=4)


def _reply(ws: Any, sent: str | bytes) -> dict[str, Any]:
    """The server's answer to one message: an error naming a field, or (for a message that was valid after
    all) a chunk whose frames are read off the socket."""
    reply = json.loads(ws.recv(timeout=60))
    if reply["type"] == "chunk":
        for _ in range(reply["frames"]):
            assert isinstance(ws.recv(timeout=30), bytes)
        return reply
    assert reply["type"] == "error" and isinstance(reply["field"], str), (sent[:200], reply)  # "" for a key ""
    assert reply["message"].startswith(reply["field"] + ":"), reply
    assert " at 0x" not in reply["message"], reply  # no object repr
    return reply


def test_hostile_messages_get_errors_and_leave_the_session_usable(server):
    url = server.url.replace("http://", "ws://")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        @SESSIONS
        @given(messages=MESSAGES)
        def run(messages: list[str | bytes]) -> None:
            opened = client.post("/v1/sessions", json={**OPEN, "mode": "forward_dynamics"})
            assert opened.status_code == 200, opened.text
            session = opened.json()["id"]
            with connect(f"{url}/v1/sessions/{session}/ws", open_timeout=10, max_size=None) as ws:
                assert json.loads(ws.recv(timeout=10))["type"] == "session"
                chunks = 0
                for message in messages:
                    ws.send(message)
                    chunks += _reply(ws, message)["type"] == "chunk"
                ws.send(VALID)  # still usable: the next chunk runs, after the chunks that did
                reply = _reply(ws, VALID)
                assert reply["type"] == "chunk" and reply["index"] == chunks, reply
                described = client.get(f"/v1/sessions/{session}").json()
                assert described["chunks"] == chunks + 1 and described["connected"], described
            deadline = time.monotonic() + 10  # closing the socket closes the session, as soon as the server sees it
            while client.get(f"/v1/sessions/{session}").status_code != 404:
                assert time.monotonic() < deadline, "the session outlived its socket"
                time.sleep(0.02)

        run()
        assert client.get("/health").status_code == 200
