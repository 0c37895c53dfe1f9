"""max_request_seconds on a served tiny Qwen2.5-Omni: a speech run past the budget is stopped with a 504 and its
KV returned; once the server has measured its pace, input that cannot fit is refused up front (#40)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from tests.helpers.polling import wait_until
from tests.helpers.qwen_omni_checkpoints import OMNI_A, write_tiny_omni
from tests.helpers.servers import ThreadServer
from vidloom.serving.config import ServeConfig


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from vidloom.generator import VideoGenerator

    torch.set_num_threads(1)
    folder = write_tiny_omni(tmp_path_factory.mktemp("omni") / "omni-tiny", OMNI_A)
    engine = VideoGenerator.from_pretrained(str(folder), device="cpu").engine
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("budget-data"), queue_size=4, graceful_shutdown_s=2,
                         max_request_seconds=60.0)
    with ThreadServer(engine, config) as running:
        yield running


@pytest.fixture
def budget(server, monkeypatch):
    state = server.app.state.chat.budget
    monkeypatch.setattr(state, "_pace", {})
    monkeypatch.setattr(state, "seconds", 60.0)
    return state


def _speech(server, text: str, **extra) -> httpx.Response:
    model = server.app.state.jobs.card.model_id
    with httpx.Client(base_url=server.url, timeout=120) as client:
        return client.post("/v1/audio/speech", json={"model": model, "voice": "Chelsie", "input": text,
                                                     "response_format": "pcm", "seed": 1, **extra})


def _kv_idle(server) -> bool:
    return server.app.state.jobs.engine.chat_stats()["kv_blocks_in_use"] == 0


def test_a_run_past_the_budget_is_stopped_with_a_504_and_its_kv_returns(server, budget):
    budget.seconds = 0.01
    r = _speech(server, "the kite rose over the dunes " * 8)
    assert r.status_code == 504, r.text
    error = r.json()["error"]
    assert error["code"] == "deadline_exceeded" and "max_request_seconds" in error["message"]
    wait_until(lambda: _kv_idle(server), timeout=30)
    budget.seconds = 60.0
    assert _speech(server, "hello").status_code == 200  # the server goes on


def test_a_streamed_run_past_the_budget_ends_with_the_error(server, budget):
    budget.seconds = 0.01
    r = _speech(server, "the kite rose over the dunes " * 8, stream_format="sse")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["error"]["code"] == "deadline_exceeded", events[-1]
    wait_until(lambda: _kv_idle(server), timeout=30)


def test_input_that_cannot_fit_at_the_measured_pace_is_refused_before_it_runs(server, budget, monkeypatch):
    assert _speech(server, "hello there").status_code == 200
    pace = budget.pace("speech")
    assert pace is not None and pace > 0
    budget.seconds = pace * 100  # about 100 characters fit
    engine = server.app.state.jobs.engine
    monkeypatch.setattr(engine, "submit", lambda *a, **k: pytest.fail("submitted"))
    r = _speech(server, "x" * 200)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input" and error["code"] == "limit_exceeded"
    assert "200 characters would take about" in error["message"] and "max_request_seconds" in error["message"]


def _wav(seconds: float) -> str:
    import base64
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(16000)
        out.writeframes(b"\0\0" * int(16000 * seconds))
    return base64.b64encode(buf.getvalue()).decode()


def test_a_spoken_chat_that_cannot_fit_is_refused_before_its_media_are_read(server, budget, monkeypatch):
    import vidloom.serving.chat_routes as chat_routes

    budget.observe("audio_chat", 10, 10.0)  # a measured 1 s per token: 100 tokens do not fit in 60 s
    monkeypatch.setattr(chat_routes, "chat_media_bytes", lambda *a: pytest.fail("media headers read"))
    model = server.app.state.jobs.card.model_id
    content = [{"type": "input_audio", "input_audio": {"data": _wav(1.0), "format": "wav"}},
               {"type": "text", "text": "what do you hear?"}]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 100,
            "modalities": ["text", "audio"], "audio": {"voice": "Chelsie", "format": "wav"}}
    with httpx.Client(base_url=server.url, timeout=120) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "max_tokens" and error["code"] == "limit_exceeded"
    assert "100 tokens would take about 100 s" in error["message"]
