"""World-model sessions over HTTP and a real WebSocket (uvicorn on 127.0.0.1, the `websockets` client).

A two-chunk session driven over the socket gives the frames (and policy actions) of the Python session, hence
of the single calls it stands for (test_cosmos3_action_session.py); bad messages get an error naming the
field and the session stays usable; a disconnect (also mid-chunk), DELETE or the idle TTL frees every byte
the session held in the cache manager; the socket checks the API key, Origin and Host like the HTTP routes.
"""

from __future__ import annotations

import base64
import io
import json
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
from PIL import Image
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.helpers.servers import ThreadServer
from vidloom import ActionInput
from vidloom.core.deploy import DeployConfig
from vidloom.serving.config import ServeConfig
from vidloom.serving.session_routes import encode_frames

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
KEY = "sk-session-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "push the block to the left"
OPEN = {"prompt": PROMPT, "domain_name": "pusht", "chunk_size": 4, "resolution_tier": 256,
        "num_inference_steps": 2, "guidance_scale": 3.0, "seed": 11}


def _first() -> Image.Image:
    return Image.fromarray(np.random.default_rng(5).integers(0, 256, (48, 64, 3), dtype=np.uint8))


def _data_url() -> str:
    buf = io.BytesIO()
    _first().save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def served(cosmos3_action_dir: Path, tmp_path_factory):
    from vidloom.generator import VideoGenerator

    generator = VideoGenerator.from_pretrained(cosmos3_action_dir, device="cpu",
                                               deploy=DeployConfig(kv_session_ttl_s=600))
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("session-data"), graceful_shutdown_s=2, api_key=KEY)
    with ThreadServer(generator.engine, config) as server:
        yield server, generator


def _open(server: ThreadServer, **fields: object) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/sessions", json={**OPEN, "input_reference": _data_url(), **fields},
                      headers=AUTH, timeout=60)


def _ws(server: ThreadServer, session_id: str, query: str = "", host: str | None = None, **options: object):
    """A socket to the session; `host`: connect to the server but name this Host (a DNS-rebinding page)."""
    url = server.url.replace("http://", "ws://") + f"/v1/sessions/{session_id}/ws{query}"
    options.setdefault("additional_headers", AUTH)
    if host is not None:
        port = int(server.url.rsplit(":", 1)[1])
        options["sock"] = socket.create_connection(("127.0.0.1", port))
        url = url.replace("127.0.0.1", host)
    return connect(url, open_timeout=10, **options)


@contextmanager
def _connected(server: ThreadServer) -> Iterator[tuple[dict, Any]]:
    """A new session and its socket, past the socket's first message (the session's description)."""
    session = _open(server).json()
    with _ws(server, session["id"]) as ws:
        ws.recv(timeout=10)
        yield session, ws


def _receive_chunk(ws) -> tuple[dict, list[bytes]]:
    header = json.loads(ws.recv(timeout=120))
    assert header["type"] == "chunk", header
    return header, [ws.recv(timeout=30) for _ in range(header["frames"])]


def _settled(check, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


@pytest.mark.parametrize("mode, fmt", [("policy", "png"), ("forward_dynamics", "jpeg")])
def test_two_chunks_over_the_socket_equal_the_python_session(served, mode: str, fmt: str):
    server, generator = served
    caches = generator.engine.caches
    baseline = caches.bytes_in_use
    drives = [np.full((4, 2), value, dtype=np.float32) for value in (0.5, -1.0)]
    created = _open(server, mode=mode)
    assert created.status_code == 200, created.text
    session = created.json()
    assert session["mode"] == mode and session["chunks"] == 0 and session["seed"] == 11
    received = []
    with _ws(server, session["id"], f"?format={fmt}") as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session"
        for k in range(2):
            ws.send(json.dumps({"actions": drives[k].tolist()} if mode == "forward_dynamics" else {}))
            header, images = _receive_chunk(ws)
            assert header["index"] == k and header["format"] == fmt and len(images) == 5
            assert (header["width"], header["height"]) == (64, 48)
            received.append((header, images))
        assert caches.session_ids() == [session["id"]] and caches.bytes_in_use > baseline
        state = httpx.get(f"{server.url}/v1/sessions/{session['id']}", headers=AUTH).json()
        assert state["chunks"] == 2 and state["connected"]
    assert _settled(lambda: caches.bytes_in_use == baseline and not caches.session_ids())  # disconnect frees
    assert httpx.get(f"{server.url}/v1/sessions/{session['id']}", headers=AUTH).status_code == 404
    block = ActionInput(mode=mode, domain_name="pusht", chunk_size=4, resolution_tier=256)
    with generator.open_session(PROMPT, image=_first(), action=block, num_inference_steps=2,
                                guidance_scale=3.0, seed=11) as python:
        for k, (header, images) in enumerate(received):
            chunk = python.step(drives[k] if mode == "forward_dynamics" else None)
            assert images == encode_frames(chunk.frames, fmt), f"chunk {k}: the same encoded frames"
            decoded = np.stack([np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) for data in images])
            error = np.abs(decoded.astype(int) - chunk.frames.astype(int))
            # PNG is lossless; JPEG (q90, 4:4:4) of a random-weight model's noise-like frames: mean 6, max ~42 levels
            assert error.max() == 0 if fmt == "png" else (error.mean() <= 10 and error.max() <= 64)
            if mode == "policy":
                assert np.abs(np.asarray(header["actions"], dtype=np.float32) - chunk.actions).max() <= 1e-6
            else:
                assert "actions" not in header


def test_bad_messages_name_the_field_and_the_session_stays_usable(served):
    server, generator = served
    caches = generator.engine.caches
    baseline = caches.bytes_in_use
    with _connected(server) as (session, ws):
        bad = [("not json", "message"), ('{"actions": [[0.1, 0.2, 0.3]]}', "actions"),
               ('{"actions": [[NaN, 0.0]]}', "message"), ('{"actions": [[1e999, 0.0]]}', "actions[0]"),
               ('{"actions": [[0.1, 0.2], [0.3]]}', "actions[1]"), ('{"actions": "left"}', "actions"),
               ('{"actions": [[0.1, 0.2]], "speed": 2}', "speed"), ("[1, 2]", "message"), ("{}", "actions"), ('{"": 1}', "message"),
               ('{"actions": [[1' + "0" * 400 + ', 0.0]]}', "actions[0]"), ('{"\\ud800": 1}', "message")]
        for text, field in bad:
            ws.send(text)
            reply = json.loads(ws.recv(timeout=30))
            assert reply["type"] == "error" and reply["field"] == field, (text, reply)
        ws.send(b"\x00\x01")
        assert json.loads(ws.recv(timeout=30))["field"] == "message"
        ws.send(json.dumps({"actions": [[0.5, 0.5]]}))  # still usable: a shorter chunk repeats its last action
        header, images = _receive_chunk(ws)
        assert header["index"] == 0 and len(images) == 5
    assert _settled(lambda: caches.bytes_in_use == baseline and not caches.session_ids())


def test_a_disconnect_mid_chunk_frees_the_session(served):
    server, generator = served
    caches = generator.engine.caches
    baseline = caches.bytes_in_use
    cancelled = _cancelled_chunks(server)
    with _connected(server) as (session, ws):
        ws.send(json.dumps({"actions": [[1.0, -1.0]] * 4}))
    sessions = server.app.state.sessions
    assert _settled(lambda: len(sessions) == 0 and caches.bytes_in_use == baseline and not caches.session_ids())
    assert httpx.get(f"{server.url}/health").json()["in_flight"] == 0
    assert _cancelled_chunks(server) == cancelled + 1  # the chunk was stopped, not run to its end


def _cancelled_chunks(server: ThreadServer) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith('vidloom_requests_total{kind="session_chunk",status="cancelled"}'):
            return float(line.split()[-1])
    return 0.0


def test_delete_and_idle_expiry_close_the_session(served):
    server, generator = served
    caches = generator.engine.caches
    baseline = caches.bytes_in_use
    with _connected(server) as (session, ws):
        gone = httpx.delete(f"{server.url}/v1/sessions/{session['id']}", headers=AUTH)
        assert gone.status_code == 200 and gone.json()["deleted"]
        assert json.loads(ws.recv(timeout=10)) == {"type": "closed", "reason": "deleted"}
    assert httpx.delete(f"{server.url}/v1/sessions/{session['id']}", headers=AUTH).status_code == 404
    sessions = server.app.state.sessions
    ttl = sessions.ttl_s
    try:
        with _connected(server) as (session, ws):
            ws.send(json.dumps({"actions": [[0.2, 0.1]]}))
            _receive_chunk(ws)
            assert caches.bytes_in_use > baseline
            sessions.ttl_s = 0.3  # idle from now on: the expirer closes it and tells the client
            closed = json.loads(ws.recv(timeout=30))
            assert closed == {"type": "closed", "reason": "expired"}
    finally:
        sessions.ttl_s = ttl
    assert _settled(lambda: caches.bytes_in_use == baseline and not caches.session_ids() and len(sessions) == 0)
    scraped = httpx.get(f"{server.url}/metrics").text
    assert "vidloom_world_sessions 0.0" in scraped and "vidloom_world_sessions_expired_total 1.0" in scraped


@pytest.mark.parametrize("fields, param", [
    ({"input_reference": None}, "input_reference"),
    ({"input_reference": "data:image/png;base64,@@@"}, "input_reference"),
    ({"input_reference": "https://example.com/a.png"}, "input_reference"),
    ({"domain_name": "mars_rover"}, "domain_name"),
    ({"mode": "inverse_dynamics"}, "mode"),
    ({"chunk_size": 0}, "chunk_size"),
    ({"view_point": "top"}, "view_point"),
    ({"num_inference_steps": "many"}, "num_inference_steps"),
    ({"steering": 1}, "steering"),
])
def test_opening_refuses_bad_fields_by_name(served, fields: dict, param: str):
    server, _ = served
    response = _open(server, **fields)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()
    assert len(server.app.state.sessions) == 0


def test_a_multipart_upload_opens_a_session(served):
    server, _ = served
    buf = io.BytesIO()
    _first().save(buf, format="PNG")
    form = {k: str(v) for k, v in OPEN.items()}
    response = httpx.post(f"{server.url}/v1/sessions", data=form, headers=AUTH,
                          files={"input_reference": ("first.png", buf.getvalue(), "image/png")})
    assert response.status_code == 200, response.text
    assert httpx.delete(f"{server.url}/v1/sessions/{response.json()['id']}", headers=AUTH).status_code == 200


def test_the_socket_checks_key_origin_and_host(served):
    server, _ = served
    session_id = _open(server).json()["id"]
    try:
        for options in ({"additional_headers": {}}, {"additional_headers": {"Authorization": "Bearer sk-guess"}},
                        {"origin": "http://evil.example"}, {"host": "evil.example"}):
            with pytest.raises(InvalidStatus) as refused:
                _ws(server, session_id, **options)
            assert refused.value.response.status_code == 403, options
        assert server.app.state.sessions.find(session_id) is not None  # refused handshakes touch nothing
        for query, options in ((f"?api_key={KEY}", {"additional_headers": {}}),
                               ("", {"additional_headers": {}, "subprotocols": ["vidloom", f"bearer.{KEY}"]}),
                               ("", {"origin": server.url})):
            with _ws(server, session_id, query, **options) as ws:
                assert json.loads(ws.recv(timeout=10))["type"] == "session"
                assert ws.subprotocol == ("vidloom" if "subprotocols" in options else None)
            assert _settled(lambda: server.app.state.sessions.find(session_id) is None)  # a disconnect closes it
            session_id = _open(server).json()["id"]
    finally:
        httpx.delete(f"{server.url}/v1/sessions/{session_id}", headers=AUTH)


def test_a_full_server_refuses_more_sessions(served):
    server, _ = served
    sessions = server.app.state.sessions
    limit = sessions.max_sessions
    sessions.max_sessions = 1
    first = _open(server).json()
    try:
        refused = _open(server)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_sessions"
        assert "Retry-After" in refused.headers and len(sessions) == 1
    finally:
        sessions.max_sessions = limit
        httpx.delete(f"{server.url}/v1/sessions/{first['id']}", headers=AUTH)
