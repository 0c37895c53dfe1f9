"""A server on a network: API key (also through the openai client), Host and Origin checks, CORS, docs, echoes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import SMALL, BlockingJob, create_video, wait_for_status
from vidloom.serving import jobs as jobs_module

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks the Sora API deprecated

KEY = "sk-test-0123456789"


def _assert_openai_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    return error


def test_api_key_guards_every_route_but_health(start_server):
    server = start_server(api_key=KEY)
    with httpx.Client(base_url=server.url, timeout=30) as anon:
        for method, path in (("GET", "/v1/videos"), ("POST", "/v1/videos"), ("GET", "/v1/models"),
                             ("POST", "/v1/images/generations"), ("GET", "/v1/videos/video_" + "0" * 32)):
            response = anon.request(method, path, json={"prompt": "a cat"})
            error = _assert_openai_error(response, 401, "invalid_api_key")
            assert error["type"] == "invalid_request_error" and response.headers["www-authenticate"] == "Bearer"
        wrong = anon.get("/v1/videos", headers={"Authorization": "Bearer sk-wrong-key"})
        assert "sk-wrong-key" not in _assert_openai_error(wrong, 401, "invalid_api_key")["message"]
        assert anon.get("/health").status_code == 200
        assert anon.get("/metrics").status_code == 200  # scrapers carry no key unless --metrics-need-key
    with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as client:
        video = create_video(client)
        assert wait_for_status(client, video["id"], {"completed", "failed"})["status"] == "completed"


def test_metrics_can_require_the_key(start_server):
    server = start_server(api_key=KEY, metrics_need_key=True)
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    assert httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_openai_client_api_key_just_works(start_server, tmp_path: Path):
    openai = pytest.importorskip("openai")
    server = start_server(api_key=KEY)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    extra = {k: v for k, v in SMALL.items() if k != "size"}
    video = client.videos.create(prompt="a cat", size="48x32", extra_body=extra)
    with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as http:
        wait_for_status(http, video.id, {"completed"})
    assert client.videos.retrieve(video.id).status == "completed"
    client.videos.download_content(video.id).write_to_file(tmp_path / "out.mp4")
    assert (tmp_path / "out.mp4").stat().st_size > 0
    assert [m.id for m in client.models.list()] == ["wan2.1-demo"]

    intruder = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-guess", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        intruder.videos.list()


def test_foreign_host_names_are_refused(start_server):
    server = start_server(allowed_hosts=("videos.internal",))
    port = server.url.rsplit(":", 1)[1]
    with httpx.Client(base_url=server.url, timeout=30) as client:
        rebound = client.get("/v1/videos", headers={"Host": f"attacker.example:{port}"})
        assert "--allowed-host" in _assert_openai_error(rebound, 400, "invalid_host")["message"]
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"videos.internal:{port}"):
            assert client.get("/v1/videos", headers={"Host": host}).status_code == 200, host


def test_cross_origin_writes_and_plain_text_bodies_are_refused(client: httpx.Client, server):
    with BlockingJob(client) as job:
        # A cross-site <form enctype="text/plain"> or fetch(no-cors) POST: the job must keep running.
        plain = client.post(f"/v1/videos/{job.id}/cancel", content=b"x", headers={"content-type": "text/plain"})
        _assert_openai_error(plain, 415, "unsupported_media_type")
        form = client.post("/v1/videos", data={"prompt": "a cat", "size": "48x32"})  # urlencoded
        _assert_openai_error(form, 415, "unsupported_media_type")
        foreign = client.post(f"/v1/videos/{job.id}/cancel", headers={"Origin": "https://evil.example"})
        _assert_openai_error(foreign, 403, "origin_not_allowed")
        evil = {"Origin": "https://evil.example"}
        multipart = client.post("/v1/videos", files={"prompt": (None, "a cat")}, headers=evil)
        _assert_openai_error(multipart, 403, "origin_not_allowed")
        assert client.delete(f"/v1/videos/{job.id}", headers=evil).status_code == 403
        assert client.get(f"/v1/videos/{job.id}").json()["status"] == "in_progress"
        # No CORS headers by default: a foreign page cannot read answers either.
        assert "access-control-allow-origin" not in client.get("/v1/videos", headers=evil).headers
        same_origin = client.post(f"/v1/videos/{job.id}/cancel", headers={"Origin": server.url})
        assert same_origin.status_code == 200 and same_origin.json()["status"] == "cancelled"


def test_cors_origin_opt_in(start_server):
    app = "https://app.example.com"
    server = start_server(cors_origins=(app,), api_key=KEY)
    preflight = httpx.options(f"{server.url}/v1/videos", headers={
        "Origin": app, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == app
    auth = {"Authorization": f"Bearer {KEY}", "Origin": app}
    created = httpx.post(f"{server.url}/v1/videos", json={"prompt": "a cat", **SMALL}, headers=auth)
    assert created.status_code == 200 and created.headers["access-control-allow-origin"] == app
    other = httpx.options(f"{server.url}/v1/videos", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers


def test_docs_are_off_unless_enabled(client: httpx.Client, start_server):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 404, path
    server = start_server(enable_docs=True, api_key=KEY)
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(f"{server.url}{path}").status_code == 200, path


def test_errors_truncate_echoes(client: httpx.Client):
    huge = "video_" + "a" * 10_000  # about what fits in a request line
    for response in (client.get(f"/v1/videos/{huge}"), client.get("/v1/videos", params={"after": huge})):
        assert response.status_code in (400, 404) and len(response.content) < 1000, len(response.content)
        assert "10006 characters" in response.json()["error"]["message"]
    for body in ({"prompt": "a cat", "x" * 100_000: 1}, {"prompt": "a cat", "model": "m" * 100_000}):
        response = client.post("/v1/videos", json=body)
        assert response.status_code in (400, 404) and len(response.content) < 3000, len(response.content)


def test_output_errors_name_no_absolute_path(client: httpx.Client, server, monkeypatch):
    def disk_full(frames, fps, path: Path, **_: object) -> None:
        raise OSError(28, "No space left on device", str(path.with_name(f".{path.stem}.tmp.mp4")))

    monkeypatch.setattr(jobs_module, "write_video", disk_full)
    video = wait_for_status(client, create_video(client)["id"], {"completed", "failed"})
    error = video["error"]
    assert video["status"] == "failed" and error["code"] == "output_error"
    data_dir = str(server.config.data_dir.resolve())
    assert data_dir not in error["message"] and "No space left on device" in error["message"]
    assert f"videos/.{video['id']}.tmp.mp4" in error["message"]
    assert data_dir not in client.get("/v1/videos").text
