"""Work limits, boundary validation and slow clients, against a real uvicorn on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import httpx
import pytest

from tests.helpers.servers import SMALL, BlockingJob, create_video, wait_for_status

BASE = {"prompt": "a cat", **SMALL}


def _error(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


# -- work limits (defaults derived from the demo card: 192x128, 17 frames, 8 steps) ---------------

@pytest.mark.parametrize(("changes", "param", "limit"), [
    ({"size": "2048x2048", "num_frames": 1}, "size", "max_pixels"),
    ({"num_frames": 1025}, "num_frames", "max_frames"),
    ({"num_frames": None, "seconds": "1000"}, "seconds", "max_frames"),
    ({"num_inference_steps": 1_000_000}, "num_inference_steps", "max_steps"),
    ({"prompt": "x" * 9000}, "prompt", "max_prompt_chars"),
])
def test_work_over_a_limit_is_refused_naming_field_and_limit(client, changes, param, limit):
    body = {k: v for k, v in {**BASE, **changes}.items() if v is not None}
    error = _error(client.post("/v1/videos", json=body))
    assert error["param"] == param and limit in error["message"] and error["code"] == "limit_exceeded"
    assert client.get("/v1/videos", params={"limit": 100}).status_code == 200


def test_limits_are_configurable_and_memory_is_estimated(start_server):
    server = start_server(max_steps=3, max_pixels=96 * 64, max_request_memory_bytes=160 << 20)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert "max_steps" in _error(client.post("/v1/videos", json={**BASE, "num_inference_steps": 4}))["message"]
        assert _error(client.post("/v1/videos", json={**BASE, "size": "112x64"}))["param"] == "size"
        # 96x64 fits max_pixels, one frame of it fits 160 MiB in the demo's memory estimate, 77 frames do not.
        huge = _error(client.post("/v1/videos", json={**BASE, "size": "96x64", "num_frames": 77}))
        assert huge["param"] == "num_frames" and "max_request_memory" in huge["message"], huge
        assert client.get("/v1/videos").json()["data"] == []  # nothing refused was stored
        video = create_video(client, num_inference_steps=2)  # a request within every limit still runs
        assert wait_for_status(client, video["id"], {"completed", "failed"})["status"] == "completed"


def test_the_runtime_memory_budget_answers_as_the_server_limit_did(start_server, demo_engine):
    """Without --max-request-memory-gb the runtime's own budget refuses, with the same 400 as the limit."""
    assert demo_engine.admission.budget_bytes == demo_engine.limits.max_memory_bytes is not None
    server = start_server(max_pixels=16384 * 16384, slots=2)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        # ~340 GB by the demo's estimate: more than any test machine has free, even when idle.
        huge = _error(client.post("/v1/videos", json={**BASE, "size": "16384x16384", "num_frames": 1}))
        assert huge["param"] == "size" and huge["code"] == "limit_exceeded" and "max_request_memory" in huge["message"]
        assert client.get("/v1/videos").json()["data"] == []
        assert demo_engine.admission.in_use == 0  # refused at submit: nothing was held


def test_prompt_is_stored_once_per_video_object(client):
    video = create_video(client, prompt="a fox " * 100)
    assert video["prompt"] == "a fox " * 100 and "prompt" not in video["parameters"]
    assert video["parameters"]["seed"] == SMALL["seed"]


def test_image_requests_meet_the_same_limits(client):
    error = _error(client.post("/v1/images/generations", json={"prompt": "a cat", "size": "2048x2048"}))
    assert error["param"] == "size" and "max_pixels" in error["message"]


# -- values that used to be accepted and then fail mid-run (or store a poisoned job) ----------

RAW_BAD = [
    ('"seed": 18446744073709551616', "seed"),
    ('"seed": -1', "seed"),
    ('"fps": 2147483648', "fps"),
    ('"fps": 1e9', "fps"),
    ('"flow_shift": NaN', "flow_shift"),
    ('"flow_shift": Infinity', "flow_shift"),
    ('"guidance_scale": NaN', "guidance_scale"),
    ('"guidance_scale": Infinity', "guidance_scale"),
    ('"guidance_scale": 1e308', "guidance_scale"),
    ('"negative_prompt": "\\udfff"', "negative_prompt"),
    ('"size": "\\uff16\\uff14x48"', "size"),  # fullwidth digits
    ('"size": " 64 x 48"', "size"),
]


@pytest.mark.parametrize(("fragment", "param"), RAW_BAD, ids=[f for f, _ in RAW_BAD])
def test_bad_values_are_400_naming_the_field(client, fragment, param):
    fields = {k: v for k, v in BASE.items() if f'"{k}"' not in fragment}
    raw = json.dumps(fields)[:-1] + ", " + fragment + "}"
    error = _error(client.post("/v1/videos", content=raw, headers={"content-type": "application/json"}))
    assert error["param"] == param, error


def test_lone_surrogate_prompt_is_refused_and_never_stored(client):
    for value in ("\\ud800", "\\udfff"):
        raw = '{"prompt": "' + value + '", "size": "48x32", "num_frames": 5, "num_inference_steps": 2}'
        error = _error(client.post("/v1/videos", content=raw, headers={"content-type": "application/json"}))
        assert error["param"] == "prompt"
    assert client.get("/v1/videos", params={"limit": 100}).status_code == 200  # the list still renders


def test_deeply_nested_json_is_400(client):
    for raw in ("[" * 100_000, '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"):
        error = _error(client.post("/v1/videos", content=raw, headers={"content-type": "application/json"}))
        assert error["code"] == "invalid_json"
    assert client.get("/health").status_code == 200


def test_file_part_for_prompt_is_400(client):
    response = client.post("/v1/videos", data={"size": "48x32"}, files={"prompt": ("p.txt", b"a cat", "text/plain")})
    error = _error(response)
    assert error["param"] == "prompt" and "file" in error["message"]


def test_every_rejection_is_counted_by_reason(start_server):
    server = start_server()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.post("/v1/videos", content="{", headers={"content-type": "application/json"})
        client.post("/v1/videos", json={**BASE, "sampler": "nope"})
        client.post("/v1/videos", json={**BASE, "num_inference_steps": 10**6})
        client.post("/v1/videos", json={**BASE, "bogus": 1})
        client.get("/v1/videos", params={"limit": 0})
        client.post("/v1/videos", content=b"x" * (2 << 20), headers={"content-type": "application/json"})
        metrics = client.get("/metrics").text
    counts = dict(re.findall(r'vidloom_rejected_requests_total\{reason="(\w+)"\} (\S+)', metrics))
    assert counts == {"invalid_json": "1.0", "invalid_parameter": "3.0", "limit_exceeded": "1.0",
                      "request_too_large": "1.0"}, counts


# -- HEAD, Retry-After ----------------------------------------------------------------------------

def test_head_content_answers_like_get_without_a_body(client):
    video = create_video(client)
    wait_for_status(client, video["id"], {"completed"})
    got = client.get(f"/v1/videos/{video['id']}/content")
    head = client.head(f"/v1/videos/{video['id']}/content")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == got.headers["content-length"] == str(len(got.content))
    assert client.head("/v1/videos/video_" + "0" * 32 + "/content").status_code == 404


def test_retry_after_follows_observed_job_time(start_server):
    server = start_server(queue_size=1)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        done = create_video(client)  # a job of ~0.1 s: the mean the server learns
        wait_for_status(client, done["id"], {"completed"})
        with BlockingJob(client), BlockingJob(client, wait_running=False):
            response = client.post("/v1/videos", json=BASE)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"  # not a fixed 10 s


# -- clients that go away or never finish ---------------------------------------------------------

def test_image_client_disconnect_cancels_the_render(client):
    body = {"prompt": "a cat", "size": "48x32", "num_inference_steps": 2000}
    with pytest.raises(httpx.ReadTimeout):
        client.post("/v1/images/generations", json=body, timeout=1.0)
    deadline = time.monotonic() + 10
    while client.get("/health").json()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.get("/health").json()["in_flight"] == 0, "the render kept its slot after the client left"
    assert 'vidloom_requests_total{kind="image",status="cancelled"} 1.0' in client.get("/metrics").text


def _port(server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def test_slowloris_header_dribble_is_disconnected(start_server):
    server = start_server(header_timeout_s=1.0)
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/videos HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed = False
        while time.monotonic() - started < 4:
            try:
                sock.sendall(b"X-Slow: 1\r\n")
                sock.settimeout(0.3)
                if sock.recv(1024) == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except OSError:  # reset by the server
                closed = True
                break
        elapsed = time.monotonic() - started
    assert closed and elapsed < 2.5, f"still open after {elapsed:.1f}s"
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_slow_body_gets_408(start_server):
    server = start_server(body_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as sock:
        sock.sendall(b"POST /v1/videos HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{\"prompt\"")
        started = time.monotonic()
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout_s" in answer, answer
    assert time.monotonic() - started < 3


def test_idle_keep_alive_connection_is_closed(start_server):
    server = start_server(keep_alive_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        started, received = time.monotonic(), b""
        while chunk := sock.recv(4096):  # the response, then the server's close (b"")
            received += chunk
    assert b"200 OK" in received and b'"status":"ok"' in received
    assert time.monotonic() - started < 2.5


# -- event streams: a slow reader gets a bounded queue, and always the final event ------------

def test_slow_sse_reader_queue_is_bounded_and_keeps_the_final_event(demo_engine, tmp_path):
    from vidloom.serving.config import ServeConfig
    from vidloom.serving.jobs import JobManager
    from vidloom.serving.params import plan_video
    from vidloom.serving.protocol import VideoCreateBody

    async def run() -> tuple[list[str], list[str]]:
        config = ServeConfig(data_dir=tmp_path, sse_queue_size=3)
        manager = JobManager(demo_engine, config, asyncio.get_running_loop())
        try:
            body = VideoCreateBody(prompt="a cat", size="48x32", num_frames=5, num_inference_steps=30)
            record = manager.submit_video(plan_video(body, manager.card, None))
            slow = manager.subscribe(record.id)  # never read while the job runs
            assert slow is not None and slow.updates is not None
            while manager.get(record.id).status not in ("completed", "failed", "cancelled"):
                await asyncio.sleep(0.01)
            slow_events = [slow.updates.get_nowait().event for _ in range(slow.updates.qsize())]
            return slow_events, [manager.get(record.id).status]
        finally:
            await manager.close()

    events, status = asyncio.run(run())
    assert status == ["completed"]
    assert len(events) == 3 and events[-1] == "completed", events  # 30+ progress ticks were coalesced away
