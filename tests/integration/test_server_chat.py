"""/v1/chat/completions on a tiny Cosmos3 Omni checkpoint, as clients use it: uvicorn on 127.0.0.1, the official
openai package (unmodified) and httpx for what the client library hides (raw SSE, error bodies, disconnects)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.helpers.cosmos3_checkpoints import write_tiny_cosmos3
from tests.helpers.servers import ThreadServer
from tests.helpers.upload_bombs import png_claiming
from vidloom.serving.config import ServeConfig

HELLO = [{"role": "user", "content": "tell me a story about robots"}]
# A 2x2 red PNG as a data: URL.
PNG_URL = ("data:image/png;base64,"
           "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg==")
# A PNG whose header claims 100000x100000 (PIL's DecompressionBombError was a 500 and a reset connection).
BOMB_URL = "data:image/png;base64," + base64.b64encode(png_claiming(100_000, 100_000)).decode()
# A video that renders far longer than any test waits (each test cancels it): 700 steps of the tiny model could end
# on an idle core before a loaded client got its chat in next to it.
VIDEO_STEPS = 100_000
LONG = 300  # tokens: about a second of decoding on the tiny model, which a cancellation must cut short
LONG_CANDIDATES = ("fox", "a fox", "the fox", "snow", "hello world", "robots dream", "1 2 3 4")


@pytest.fixture(scope="module")
def cosmos3_dir(tmp_path_factory) -> Path:
    return write_tiny_cosmos3(tmp_path_factory.mktemp("cosmos3") / "cosmos3-tiny")


@pytest.fixture(scope="module")
def cosmos3_engine(cosmos3_dir):
    from vidloom.generator import VideoGenerator

    return VideoGenerator.from_pretrained(cosmos3_dir, device="cpu").engine


@pytest.fixture(scope="module")
def chat_server(cosmos3_engine, tmp_path_factory):
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("chat-data"), queue_size=16, graceful_shutdown_s=2,
                         max_steps=VIDEO_STEPS)
    with ThreadServer(cosmos3_engine, config) as running:
        yield running


@pytest.fixture
def client(chat_server):
    with httpx.Client(base_url=chat_server.url, timeout=60) as c:
        yield c


@pytest.fixture
def oc(chat_server):
    import openai

    return openai.OpenAI(base_url=f"{chat_server.url}/v1", api_key="unused", max_retries=0)


def _model(client: httpx.Client) -> str:
    return client.get("/v1/models").json()["data"][0]["id"]


def _kv_blocks(client: httpx.Client) -> tuple[float, float]:
    """(in use, total) from /metrics."""
    values = {}
    for line in client.get("/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("vidloom_kv_blocks_in_use", "vidloom_kv_blocks_total"):
            values[name] = float(value)
    return values["vidloom_kv_blocks_in_use"], values["vidloom_kv_blocks_total"]


def _wait_pool_full(client: httpx.Client, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while _kv_blocks(client)[0] != 0:
        assert time.monotonic() < deadline, f"KV blocks still held: {_kv_blocks(client)}"
        time.sleep(0.02)


def _sse_data(lines: list[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


def _first_line_read(response: httpx.Response) -> Iterator[str]:
    """The stream's line iterator, past its first data line; keep it while the chat should stay connected.

    A dropped `response.iter_lines()` closes the connection at once: its generators are finalised on the spot and
    httpcore closes an unfinished response's connection on GeneratorExit, so the server sees the client leave.
    (That was why chats "were cancelled after their first token" in this file: `next(response.iter_lines())`.)
    """
    lines = response.iter_lines()
    first = next(lines)
    assert first.startswith("data: {"), first
    return lines


def test_openai_client_non_streaming_greedy_length(oc, client):
    reply = oc.chat.completions.create(model=_model(client), messages=HELLO, max_completion_tokens=8,
                                       temperature=0, seed=1)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 8 and reply.usage.prompt_tokens > 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8
    again = oc.chat.completions.create(model=_model(client), messages=HELLO, max_tokens=8, temperature=0)
    assert again.choices[0].message.content == choice.message.content  # greedy is deterministic


def test_openai_client_streaming_matches_non_streaming(oc, client):
    whole = oc.chat.completions.create(model=_model(client), messages=HELLO, max_tokens=12, temperature=0)
    chunks = list(oc.chat.completions.create(model=_model(client), messages=HELLO, max_tokens=12, temperature=0,
                                             stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_raw_stream_ends_with_done(client):
    body = {"messages": HELLO, "max_tokens": 4, "temperature": 0, "stream": True}  # greedy: 15 tokens before EOS
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        data = _sse_data(list(response.iter_lines()))
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in e for e in events)  # only with stream_options.include_usage


def test_stop_strings_cut_the_answer(oc, client):
    model = _model(client)
    full = oc.chat.completions.create(model=model, messages=HELLO, max_tokens=24, temperature=0)
    text = full.choices[0].message.content
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip(), f"pick a visible stop string from {text!r}"
    cut = oc.chat.completions.create(model=model, messages=HELLO, max_tokens=24, temperature=0, stop=[stop, "zzzz"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[:text.index(stop)]
    streamed = oc.chat.completions.create(model=model, messages=HELLO, max_tokens=24, temperature=0, stop=stop,
                                          stream=True)
    pieces = [c.choices[0] for c in streamed if c.choices]
    assert "".join(p.delta.content or "" for p in pieces) == text[:text.index(stop)]
    assert pieces[-1].finish_reason == "stop"


def test_seeded_sampling_repeats(oc, client):
    kwargs = dict(model=_model(client), messages=HELLO, max_tokens=10, temperature=1.0, top_p=0.9, seed=123,
                  extra_body={"top_k": 20})
    first = oc.chat.completions.create(**kwargs).choices[0].message.content
    assert oc.chat.completions.create(**kwargs).choices[0].message.content == first


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": {"type": "text"}}]}, "messages[0].content"),
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": 10**9}, "max_tokens"),
    ({"messages": HELLO, "max_completion_tokens": 10**9}, "max_completion_tokens"),
    ({"messages": HELLO, "temperature": -1}, "temperature"),
    ({"messages": HELLO, "top_p": 0}, "top_p"),
    ({"messages": HELLO, "top_p": 1.01}, "top_p"),
    ({"messages": HELLO, "n": 2}, "n"),
    ({"messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": HELLO, "tools": []}, "tools"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}]}]},
     "messages[0].content[0].image_url"),
    # A readable image the tiny checkpoint cannot take (its diffusers folder has no vision tower): the engine says so.
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": PNG_URL}}]}]},
     "messages[0].content[1]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": BOMB_URL}}]}]},
     "messages[0].content[0].image_url"),
    ({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}]},
     "messages[0].content[0].input_audio"),
])
def test_bad_input_is_400_naming_the_field(client, body, param):
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(param)


def test_unknown_model_is_404(client):
    response = client.post("/v1/chat/completions", json={"messages": HELLO, "model": "gpt-4o"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


@pytest.fixture(scope="module")
def long_chat(chat_server) -> list[dict[str, str]]:
    """A conversation the tiny model answers greedily for LONG tokens without meeting EOS.

    The weights are random, so such a prompt is found, not assumed; a cancellation test on it proves its
    point by counting fewer than LONG tokens.
    """
    with httpx.Client(base_url=chat_server.url, timeout=60) as client:
        for text in LONG_CANDIDATES:
            messages = [{"role": "user", "content": text}]
            reply = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": LONG,
                                                              "temperature": 0}).json()
            if reply["choices"][0]["finish_reason"] == "length":
                return messages
    pytest.fail(f"no candidate prompt decodes {LONG} tokens without EOS on the tiny checkpoint")


def _metric(client: httpx.Client, name: str) -> float:
    """One sample of /metrics by its full name (labels included); 0 when it has none yet."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.rpartition(" ")[2])
    return 0.0


def _first_data_then_held_blocks(lines, client: httpx.Client) -> None:
    """Read the stream until it has sent a chunk, checking the sequence holds KV blocks meanwhile."""
    assert next(lines).startswith("data: {")
    assert _kv_blocks(client)[0] > 0


def test_disconnect_mid_stream_frees_the_sequence_at_the_next_token(client, long_chat):
    _wait_pool_full(client)
    tokens, cancelled = "vidloom_chat_generated_tokens_total", 'vidloom_requests_total{kind="chat",status="cancelled"}'
    before = {name: _metric(client, name) for name in (tokens, cancelled)}
    body = {"messages": long_chat, "max_tokens": LONG, "temperature": 0, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        _first_data_then_held_blocks(response.iter_lines(), client)
    _wait_pool_full(client)  # closing the connection cancelled the sequence and returned its blocks
    assert _metric(client, tokens) - before[tokens] < LONG  # ... long before it would have finished
    assert _metric(client, cancelled) - before[cancelled] == 1


def test_full_kv_pool_is_429_with_retry_after_and_frees_on_disconnect(cosmos3_dir, long_chat, tmp_path):
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    pool = 1024  # tokens: one long request can hold all of it
    engine = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu", deploy=DeployConfig(kv_pool_tokens=pool)).engine
    config = ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=2)
    with ThreadServer(engine, config) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        assert _kv_blocks(client) == (0, pool // 16)
        too_long = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": pool})
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "max_tokens"
        hog = {"messages": long_chat, "max_tokens": pool - 64, "temperature": 0, "stream": True}
        small = {"messages": HELLO, "max_tokens": 80}
        with client.stream("POST", "/v1/chat/completions", json=hog) as response:
            lines = response.iter_lines()
            _first_data_then_held_blocks(lines, client)
            refused = client.post("/v1/chat/completions", json=small)
            if refused.status_code != 429:  # say how the long request ended, which should have been impossible
                rest = list(lines)
                pytest.fail(f"got {refused.status_code} while a long request held the pool: {refused.text}; the "
                            f"long request's stream ended after {len(rest)} more lines with {rest[-4:]}")
            assert refused.headers["Retry-After"] == "1"
            error = refused.json()["error"]
            assert error["code"] == "kv_cache_full" and error["type"] == "rate_limit_error"
            assert "kv_pool_tokens" in error["message"]
        _wait_pool_full(client)
        assert client.post("/v1/chat/completions", json=small).status_code == 200


def test_metrics_count_tokens_and_latencies(oc, client):
    def scrape() -> dict[str, float]:
        out = {}
        for line in client.get("/metrics").text.splitlines():
            if line.startswith(("vidloom_chat_", "vidloom_kv_", "vidloom_requests_total")):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    before = scrape()
    oc.chat.completions.create(model=_model(client), messages=HELLO, max_tokens=5, temperature=0)
    after = scrape()
    assert after["vidloom_chat_generated_tokens_total"] - before["vidloom_chat_generated_tokens_total"] == 5
    ttft = "vidloom_chat_time_to_first_token_seconds_count"
    assert after[ttft] - before.get(ttft, 0) == 1
    itl = "vidloom_chat_inter_token_latency_seconds_count"
    assert after[itl] - before.get(itl, 0) == 4
    assert after["vidloom_kv_blocks_total"] > 0 and after["vidloom_kv_blocks_in_use"] == 0
    done = 'vidloom_requests_total{kind="chat",status="completed"}'
    assert after[done] - before.get(done, 0) == 1


def test_video_only_model_refuses_chat_and_still_lists_itself(start_server):
    server = start_server()  # the demo video model
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.post("/v1/chat/completions", json={"messages": HELLO})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "model" and "does not support chat" in error["message"]
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["wan2.1-demo"]
        assert "vidloom_kv_blocks_total" not in client.get("/metrics").text


def test_guards_apply_to_chat(cosmos3_engine, tmp_path):
    config = ServeConfig(data_dir=tmp_path / "data", api_key="sk-chat", max_body_bytes=4096, graceful_shutdown_s=2)
    with ThreadServer(cosmos3_engine, config) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.post("/v1/chat/completions", json={"messages": HELLO}).status_code == 401
        auth = {"Authorization": "Bearer sk-chat"}
        plain = client.post("/v1/chat/completions", content=json.dumps({"messages": HELLO}),
                            headers={**auth, "Content-Type": "text/plain"})
        assert plain.status_code == 415
        big = [{"role": "user", "content": "x" * 5000}]
        assert client.post("/v1/chat/completions", json={"messages": big}, headers=auth).status_code == 413
        foreign = client.post("/v1/chat/completions", json={"messages": HELLO},
                              headers={**auth, "Origin": "https://evil.example"})
        assert foreign.status_code == 403
        ok = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, headers=auth)
        assert ok.status_code == 200, ok.text


def _readme_block(language: str, marker: str) -> str:
    page = (Path(__file__).resolve().parents[2] / "docs" / "chat.md").read_text()
    [block] = [b for b in re.findall(rf"```{language}\n(.*?)```", page, flags=re.S) if marker in b]
    return block


def test_readme_chat_examples_run_as_written(chat_server, tmp_path):
    root = str(Path(__file__).resolve().parents[2])
    snippet = _readme_block("python", "client.chat.completions.create(")
    assert "http://127.0.0.1:8000/v1" in snippet
    proc = subprocess.run([sys.executable, "-c", snippet.replace("http://127.0.0.1:8000", chat_server.url)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": root})
    assert proc.returncode == 0, proc.stderr
    assert "tokens" in proc.stdout and ("length" in proc.stdout or "stop" in proc.stdout)
    if shutil.which("curl") is None:
        return  # the python example ran; the curl one needs curl
    shell = _readme_block("bash", "/v1/chat/completions")
    curl = shell[shell.index("curl "):].replace("http://127.0.0.1:8000", chat_server.url)
    proc = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] <= 16


def test_a_sequence_failing_mid_decode_ends_its_stream_with_an_error_event(chat_server, cosmos3_engine, client,
                                                                             monkeypatch):
    """A fault injected into the decode loop after a few tokens: the stream carries an error event then [DONE],
    a non-streamed call is a 500 naming no server path, and the failed sequence's blocks are back in the pool."""
    loop = cosmos3_engine.decoder.loop
    real_advance, calls = loop.advance, []

    def failing_advance(state, logits):
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("injected fault in /srv/models/secret/decode.py")
        return real_advance(state, logits)

    monkeypatch.setattr(loop, "advance", failing_advance)
    body = {"messages": HELLO, "max_tokens": 50, "temperature": 0, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        data = _sse_data(list(response.iter_lines()))
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["code"] == "generation_error" and "injected fault" in error["message"]
    assert "/srv/models" not in error["message"]
    assert all("finish_reason" not in d for d in data[:-2])
    calls.clear()
    whole = client.post("/v1/chat/completions", json={**body, "stream": False})
    assert whole.status_code == 500 and whole.json()["error"]["code"] == "generation_error"
    assert 'vidloom_requests_total{kind="chat",status="failed"} 2.0' in client.get("/metrics").text
    monkeypatch.undo()
    _wait_pool_full(client)
    assert client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 3}).status_code == 200


def test_a_chat_open_at_shutdown_ends_with_an_error_event_after_the_grace_period(cosmos3_engine, long_chat, tmp_path):
    config = ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=0.5)
    server = ThreadServer(cosmos3_engine, config)
    stopper = threading.Thread(target=server.stop)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            body = {"messages": long_chat, "max_tokens": 3000, "temperature": 0, "stream": True}
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                lines = response.iter_lines()
                assert next(lines).startswith("data: {")
                stopper.start()
                data = _sse_data(list(lines))
    finally:
        if stopper.ident is None:  # failed before the stop began
            stopper.start()
        stopper.join(30)
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["code"] == "shutting_down", error
    assert cosmos3_engine.decoder.stats()["kv_blocks_in_use"] == 0


def test_a_server_shutting_down_stops_only_its_own_chats(chat_server, cosmos3_engine, client, long_chat, tmp_path):
    """Two servers over one engine: server A shuts down with a chat open while a chat streams on the module's
    server; only A's chat is stopped, and the module server's chats, that one and those after, run to their end."""
    cancelled = 'vidloom_requests_total{kind="chat",status="cancelled"}'
    before = _metric(client, cancelled)
    body = {"messages": long_chat, "max_tokens": LONG, "temperature": 0, "stream": True}
    other = ThreadServer(cosmos3_engine, ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=0.2))
    stopper = threading.Thread(target=other.stop)
    try:
        with client.stream("POST", "/v1/chat/completions", json=body) as ours, \
                httpx.Client(base_url=other.url, timeout=60) as other_client, \
                other_client.stream("POST", "/v1/chat/completions", json={**body, "max_tokens": 3000}) as theirs:
            our_lines, their_lines = _first_line_read(ours), _first_line_read(theirs)
            stopper.start()
            theirs_data = _sse_data(list(their_lines))
            ours_data = _sse_data(list(our_lines))
    finally:
        if stopper.ident is None:  # failed before the stop began
            stopper.start()
        stopper.join(30)
    assert json.loads(theirs_data[-2])["error"]["code"] == "shutting_down"
    assert ours_data[-1] == "[DONE]" and json.loads(ours_data[-2])["choices"][0]["finish_reason"] == "length"
    for _ in range(3):  # later chats on the surviving server, streamed to their end
        with client.stream("POST", "/v1/chat/completions", json={**body, "max_tokens": 40}) as response:
            data = _sse_data(list(response.iter_lines()))
        assert json.loads(data[-2])["choices"][0]["finish_reason"] == "length", data[-3:]
    assert _metric(client, cancelled) == before
    _wait_pool_full(client)


def _hold_chat_after_its_first_token(monkeypatch, chat_server, cosmos3_engine) -> threading.Event:
    """Hold the device worker before the chat's second decode step until its cancellation has been asked for.

    Without the hold, a loaded machine may deschedule the test's client while the worker decodes the whole
    reply: the chat then ends on its own before its client leaves, and nothing is left to cancel. Returns
    the event set when the cancellation arrived (the hold gives up after a minute rather than hang the suite).
    """
    decoder, engine = cosmos3_engine.decoder, chat_server.app.state.jobs.engine
    run, cancel = decoder.run, engine.cancel
    cancelled, steps = threading.Event(), []

    def held_run(plans):
        if any(p.loop == "ar_decode" for p in plans):
            steps.append(len(plans))
            if len(steps) > 1:
                cancelled.wait(60)
        return run(plans)

    def cancel_then_release(request_id):
        try:
            return cancel(request_id)
        finally:
            cancelled.set()

    monkeypatch.setattr(decoder, "run", held_run)
    monkeypatch.setattr(engine, "cancel", cancel_then_release)
    return cancelled


def test_a_chat_during_a_video_counts_in_health_and_metrics_and_leaves_with_its_client(
        client, long_chat, chat_server, cosmos3_engine, monkeypatch):
    """One engine: the chat holds a place next to the rendering video (`/health`, `vidloom_in_flight`) until its
    client leaves, which cancels it through the jobs' path while the video keeps rendering."""
    from tests.helpers.servers import wait_for_status

    video = client.post("/v1/videos", json={"prompt": "a fox", "size": "64x64", "num_frames": 5,
                                            "num_inference_steps": VIDEO_STEPS, "seed": 1})  # cancelled below
    assert video.status_code == 200, video.text
    video_id = video.json()["id"]
    wait_for_status(client, video_id, {"in_progress"})
    cancelled = 'vidloom_requests_total{kind="chat",status="cancelled"}'
    before = _metric(client, cancelled)
    released = _hold_chat_after_its_first_token(monkeypatch, chat_server, cosmos3_engine)
    try:
        assert client.get("/health").json()["in_flight"] == 1
        body = {"messages": long_chat, "max_tokens": LONG, "temperature": 0, "stream": True}
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = _first_line_read(response)  # held: the client stays until the `with` ends
            # The server sends the role once the engine gave the first token, and the hold keeps the chat in flight
            # until its client leaves; polled rather than read once, so a failure says how the video stood.
            deadline = time.monotonic() + 60
            while (health := client.get("/health").json())["in_flight"] != 2:
                video_status = client.get(f"/v1/videos/{video_id}").json()["status"]
                assert time.monotonic() < deadline, (health, video_status)
                time.sleep(0.02)
            assert _metric(client, "vidloom_in_flight") == 2
        assert released.wait(60), "the chat was not cancelled when its client left"
        deadline = time.monotonic() + 60  # generous: a loaded machine takes its time, a kept place stays forever
        while _metric(client, cancelled) == before or _metric(client, "vidloom_in_flight") > 1:
            assert time.monotonic() < deadline, "the chat kept its place after its client left"
            time.sleep(0.02)
        # The video did not share the chat's fate (it may have finished meanwhile on a slow machine).
        assert client.get(f"/v1/videos/{video_id}").json()["status"] in ("in_progress", "completed")
    finally:
        released.set()
        client.post(f"/v1/videos/{video_id}/cancel")
    wait_for_status(client, video_id, {"cancelled", "completed"})
    _wait_pool_full(client)


def test_decode_slots_bound_the_chats_decoding_together_and_a_third_waits_in_the_queue(cosmos3_engine, long_chat,
                                                                                        tmp_path):
    """--decode-slots 2: two chats decode in the batched step, a third waits in the queue (vidloom_queue_depth) and
    starts when a place frees. A video renders meanwhile, so each round (a decode step, then a denoise step) is
    slow enough for the chats to hold their places while the gauges are read."""
    from tests.helpers.servers import wait_for_status

    config = ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=2, decode_slots=2, max_steps=VIDEO_STEPS)
    body = {"messages": long_chat, "max_tokens": LONG, "temperature": 0, "stream": True}
    replies: list[httpx.Response] = []
    with ThreadServer(cosmos3_engine, config) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        video_id = client.post("/v1/videos", json={"prompt": "a fox", "size": "64x64", "num_frames": 5,
                                                   "num_inference_steps": VIDEO_STEPS, "seed": 1}).json()["id"]
        wait_for_status(client, video_id, {"in_progress"})
        third = threading.Thread(target=lambda: replies.append(client.post(
            "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 8})))
        try:
            with client.stream("POST", "/v1/chat/completions", json=body) as first, \
                    client.stream("POST", "/v1/chat/completions", json=body) as second:
                streams = [_first_line_read(response) for response in (first, second)]
                third.start()
                deadline = time.monotonic() + 20
                while (scrape := _scrape(client))["vidloom_queue_depth"] < 1:  # both gauges from one scrape
                    assert time.monotonic() < deadline, "the third chat never showed in the queue depth"
                    time.sleep(0.01)
                assert scrape["vidloom_in_flight"] == 3, scrape  # the video and two chats
        finally:
            client.post(f"/v1/videos/{video_id}/cancel")
        third.join(60)  # closing the first two streams cancelled them: the third took a decode slot
        assert replies and replies[0].status_code == 200, replies
        assert _scrape(client)["vidloom_queue_depth"] == 0
        wait_for_status(client, video_id, {"cancelled", "completed"})


def _scrape(client: httpx.Client) -> dict[str, float]:
    """The unlabelled samples of one /metrics response."""
    samples = (line.partition(" ") for line in client.get("/metrics").text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, _, value in samples if "{" not in name and value}

