"""Every bad input gets its 4xx in the OpenAI error shape, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.servers import SMALL, BlockingJob, create_video, wait_for_status

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks the Sora API deprecated

BASE = {"prompt": "a cat", **SMALL}
MISSING = object()

INVALID = [
    # (field, value, status, param)
    ("size", "47x32", 400, "size"),
    ("size", "large", 400, "size"),
    ("size", 48, 400, "size"),
    ("num_frames", 6, 400, "num_frames"),
    ("num_frames", 0, 400, "num_frames"),
    ("num_frames", 100_001, 400, "num_frames"),
    ("num_inference_steps", 0, 400, "num_inference_steps"),
    ("num_inference_steps", "many", 400, "num_inference_steps"),
    ("num_inference_steps", True, 400, "num_inference_steps"),
    ("num_inference_steps", 2.5, 400, "num_inference_steps"),
    ("guidance_scale", -1, 400, "guidance_scale"),
    ("flow_shift", 0, 400, "flow_shift"),
    ("sampler", "nope", 400, "sampler"),
    ("seed", -1, 400, "seed"),
    ("fps", 0, 400, "fps"),
    ("seconds", "-1", 400, "seconds"),
    ("seconds", "soon", 400, "seconds"),
    ("seconds", 1e308, 400, "seconds"),
    ("prompt", "", 400, "prompt"),
    ("prompt", "   ", 400, "prompt"),
    ("prompt", 123, 400, "prompt"),
    ("prompt", MISSING, 400, "prompt"),
    ("negative_prompt", ["a"], 400, "negative_prompt"),
    ("num_frame", 5, 400, "num_frame"),  # a typo is named, not ignored
    ("input_reference", "file-123", 400, "input_reference"),
    ("model", "sora-2", 404, "model"),
]


@pytest.mark.parametrize(("field", "value", "status", "param"), INVALID, ids=[f"{f}={v!r}"[:40] for f, v, *_ in INVALID])
def test_invalid_parameter(client: httpx.Client, field, value, status, param):
    # num_frames would win over seconds, so seconds cases go without it.
    body = {k: v for k, v in BASE.items() if k != field and not (field == "seconds" and k == "num_frames")}
    if value is not MISSING:
        body[field] = value
    response = client.post("/v1/videos", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"]
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize(("content", "content_type"), [
    (b'{"prompt": "a cat",', "application/json"),
    (b"\xff\xfe not json", "application/json"),
    (b"[1, 2, 3]", "application/json"),
    (b"null", "application/json"),
    (b"--xyz\r\nbroken", "multipart/form-data; boundary=xyz"),
])
def test_malformed_bodies_are_400(client: httpx.Client, content: bytes, content_type: str):
    response = client.post("/v1/videos", content=content, headers={"content-type": content_type})
    assert response.status_code == 400, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_oversized_bodies_are_413_before_parsing(client: httpx.Client):
    big = b'{"prompt": "' + b"a" * (2 << 20) + b'"}'
    response = client.post("/v1/videos", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit must hold while streaming too
        for _ in range(24):
            yield b"x" * (64 << 10)

    streamed = client.post("/v1/videos", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert client.get("/health").status_code == 200
    assert wait_for_status(client, create_video(client)["id"], {"completed", "failed"})["status"] == "completed"


@pytest.mark.parametrize("path", [
    "/v1/videos/video_00000000000000000000000000000000",
    "/v1/videos/video_00000000000000000000000000000000/content",
    "/v1/videos/video_00000000000000000000000000000000/events",
    "/v1/videos/not-an-id",
    "/v1/videos/..%2F..%2Fjobs.sqlite3/content",
])
def test_unknown_ids_are_404(client: httpx.Client, path: str):
    response = client.get(path)
    assert response.status_code == 404 and "error" in response.json()
    assert client.delete("/v1/videos/video_00000000000000000000000000000000").status_code == 404
    assert client.post("/v1/videos/video_00000000000000000000000000000000/cancel").status_code == 404


@pytest.mark.parametrize(("params", "param"), [
    ({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"limit": "ten"}, "limit"), ({"order": "sideways"}, "order"),
])
def test_bad_list_parameters(client: httpx.Client, params: dict, param: str):
    response = client.get("/v1/videos", params=params)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_unknown_route_and_method_in_openai_shape(client: httpx.Client):
    assert client.get("/v1/nothing").json()["error"]["code"] == "not_found"
    assert client.put("/v1/videos").status_code == 405
    assert client.put("/v1/videos").json()["error"]["code"] == "method_not_allowed"
    assert "error" in client.put("/v1/videos").json()
    bad_variant = client.get("/v1/videos/video_00000000000000000000000000000000/content", params={"variant": "x"})
    assert bad_variant.status_code == 404  # the id is checked first


def test_queue_full_is_429_with_retry_after(start_server):
    server = start_server(queue_size=1)
    with httpx.Client(base_url=server.url, timeout=30) as client, BlockingJob(client):
        with BlockingJob(client, wait_running=False) as queued:
            assert queued.video["status"] == "queued"
            response = client.post("/v1/videos", json=BASE)
            assert response.status_code == 429
            assert int(response.headers["retry-after"]) >= 1
            error = response.json()["error"]
            assert error["code"] == "queue_full" and error["type"] == "rate_limit_error"

            openai = pytest.importorskip("openai")
            oc = openai.OpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0)
            with pytest.raises(openai.RateLimitError):
                oc.videos.create(prompt="a cat", size="48x32")
            assert client.get("/health").json()["queue_depth"] == 1
        metrics = client.get("/metrics").text
        assert 'vidloom_rejected_requests_total{reason="queue_full"} 2.0' in metrics
        accepted = client.post("/v1/videos", json=BASE)  # the queue place is free again
        assert accepted.status_code == 200
