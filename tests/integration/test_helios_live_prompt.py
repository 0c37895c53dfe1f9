"""Helios' live prompt: a prompt set while a request runs conditions the chunks from the next one on; the chunks
before it are unchanged, and a run whose prompt never changes is the plain generation. In Python (the instance's
LivePrompts) and over the server (the `/v1/videos/{id}/prompt` WebSocket, sent after chunk 0's SSE event)."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import av
import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from tests.helpers.servers import ThreadServer, wait_for_status
from vidloom.core.live_prompt import LIVE_PROMPTS, LivePrompts
from vidloom.core.output import ChunkEvent
from vidloom.generator import VideoGenerator
from vidloom.media.fmp4 import FragmentedMp4Writer
from vidloom.serving.config import ServeConfig

PROMPT, NEW_PROMPT = "a paper boat", "a red fox running through deep snow at night"
RUN = dict(num_frames=65, num_inference_steps=2, seed=5)  # two 33-frame chunks of the demo's 64x96
CHUNK = 33
SAME = 0.1  # mean level difference below which two decoded streams hold the same frames


@pytest.fixture(scope="module")
def gen(tmp_path_factory) -> VideoGenerator:
    return VideoGenerator.from_pretrained("helios-demo", device="cpu", cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def plain(gen) -> np.ndarray:
    return gen.generate(PROMPT, **RUN).frames


def prompts_of(gen: VideoGenerator) -> LivePrompts:
    return gen.engine.instance[LIVE_PROMPTS]


def test_a_prompt_set_after_chunk_0_changes_only_the_later_chunks(gen, plain):
    prompts = prompts_of(gen)
    accepted = []

    def change_after_chunk_0(event: Any) -> None:
        if isinstance(event, ChunkEvent) and event.chunk.index == 0:  # before chunk 1's first step
            accepted.append(prompts.set(event.request_id, NEW_PROMPT))

    changed = gen.generate(PROMPT, on_event=change_after_chunk_0, **RUN).frames
    assert accepted == [True]
    np.testing.assert_array_equal(changed[:CHUNK], plain[:CHUNK])
    assert mean_diff(changed[CHUNK:], plain[CHUNK:]) > 1.0  # measured 5.1 levels
    assert prompts.running() == 0  # the request's entry closed with it
    assert not prompts.set("no-such-request", NEW_PROMPT)  # nothing kept for a request that is not running


def _server_run(client: httpx.Client, server_url: str, prompts: LivePrompts, monkeypatch, change: str | None
                ) -> tuple[np.ndarray, list[dict]]:
    """One job; after its chunk 0 SSE event, optionally sends `change` over the WebSocket. Chunk 1 starts only
    once that is done (a gate on the boundary's take), so the message lands before chunk 1 as a slower step
    would let it. Returns the decoded live stream and the WebSocket replies."""
    gate, take = threading.Event(), prompts.take

    def gated_take(request_id: str) -> str | None:
        assert gate.wait(60), "the test never opened the chunk boundary"
        return take(request_id)

    monkeypatch.setattr(prompts, "take", gated_take)
    job = client.post("/v1/videos", json={"prompt": PROMPT, "size": "96x64", **RUN})
    assert job.status_code == 200, job.text
    video_id, replies = job.json()["id"], []
    with client.stream("GET", f"/v1/videos/{video_id}/events") as response:
        for line in response.iter_lines():
            if line.startswith("event:") and line.split(":", 1)[1].strip() == "chunk" and not gate.is_set():
                if change is not None:
                    with connect(server_url.replace("http", "ws") + f"/v1/videos/{video_id}/prompt") as ws:
                        replies.append(json.loads(ws.recv(timeout=30)))
                        ws.send(json.dumps({"prompt": change}))
                        replies.append(json.loads(ws.recv(timeout=30)))
                gate.set()
    monkeypatch.setattr(prompts, "take", take)
    assert wait_for_status(client, video_id, {"completed"})["status"] == "completed"
    stream = client.get(f"/v1/videos/{video_id}/content", params={"variant": "stream"})
    assert stream.status_code == 200, stream.text
    return decode(stream.content), replies


def decode(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def live_stream_of(frames: np.ndarray, fps: int) -> bytes:
    """The live fMP4 the server writes for these frames, chunk by chunk (its encoder is deterministic)."""
    out = io.BytesIO()
    writer = FragmentedMp4Writer(out, fps, frames.shape[2], frames.shape[1])
    for start in range(0, len(frames), CHUNK):
        writer.write(frames[start:start + CHUNK])
    writer.close()
    return out.getvalue()


def mean_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(int) - b.astype(int)).mean())


def test_server_prompt_change_over_the_websocket_takes_effect_at_the_next_chunk(gen, plain, tmp_path,
                                                                                  monkeypatch):
    config = ServeConfig(data_dir=tmp_path / "data", queue_size=2, graceful_shutdown_s=2)
    prompts = prompts_of(gen)
    with ThreadServer(gen.engine, config) as server, httpx.Client(base_url=server.url, timeout=300) as client:
        same, _ = _server_run(client, server.url, prompts, monkeypatch, None)
        changed, replies = _server_run(client, server.url, prompts, monkeypatch, NEW_PROMPT)
        finished = client.get("/v1/videos").json()["data"][0]["id"]
        with connect(server.url.replace("http", "ws") + f"/v1/videos/{finished}/prompt") as ws:
            assert json.loads(ws.recv(timeout=30))["type"] == "live"
            ws.send(json.dumps({"prompt": ""}))
            assert json.loads(ws.recv(timeout=30))["field"] == "prompt"
            ws.send(json.dumps({"prompt": "x" * (gen.card.max_prompt_tokens * 16 + 1)}))  # RequestLimits' default
            too_long = json.loads(ws.recv(timeout=30))
            assert too_long["field"] == "prompt" and "max_prompt_chars" in too_long["message"]
            ws.send(json.dumps({"prompt": NEW_PROMPT}))
            late = json.loads(ws.recv(timeout=30))
        with connect(server.url.replace("http", "ws") + "/v1/videos/video_unknown/prompt") as ws:
            unknown = json.loads(ws.recv(timeout=30))
    assert [r["type"] for r in replies] == ["live", "prompt"] and replies[1]["status"] == "pending"
    assert late["field"] == "video_id" and "completed" in late["message"]  # only while its chunks run
    assert unknown["field"] == "video_id" and prompts.running() == 0
    # Through the lossy stream: the same frames decode alike up to the colour conversion's rounding (its float64
    # matmul may round a .5 either way with the array's layout: measured 0.3% of values, at most 7 levels, a mean
    # of about 0.01); the new prompt moves chunk 1 by about 5 levels on average (measured 5.4).
    assert mean_diff(same, decode(live_stream_of(plain, gen.card.sampling_defaults.fps))) < SAME
    assert mean_diff(changed[:CHUNK], same[:CHUNK]) < SAME
    assert mean_diff(changed[CHUNK:], same[CHUNK:]) > 1.0
