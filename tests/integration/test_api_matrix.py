"""One request matrix against the single server and the fleet: the fleet must expose exactly the same API and limits.

"single": one `vidloom serve` (ThreadServer) per model. "fleet": the fleet's ingress (FleetServer, our uvicorn)
routing by `model` to in-process replicas of the same four models on one PostgreSQL store
(tests/helpers/fleet.py; test_fleet_ray.py runs the Ray wiring). Both get the same settings: an API key,
a 1 s header deadline, 8 connections, a 4 MiB body limit and a health port.
"""

from __future__ import annotations

import base64
import io
import socket
import time
from dataclasses import dataclass
from typing import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.servers import BLOCKING_STEPS, SMALL, ThreadServer, held_open, open_connections, wait_for_status
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.serving.config import ServeConfig

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks the Sora API deprecated

KEY = "matrix-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
KINDS = ("t2v", "i2v", "images", "chat")
MAX_CONNECTIONS = 8


@dataclass
class Api:
    urls: dict[str, str]  # kind -> base URL (the same URL for every kind on the fleet)
    models: dict[str, str]  # kind -> model id
    health_urls: dict[str, str]

    def client(self, kind: str = "t2v", **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.urls[kind], headers=AUTH, timeout=60, **kwargs)

    def openai(self, kind: str) -> "openai.OpenAI":
        return openai.OpenAI(base_url=f"{self.urls[kind]}/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def engines(demo_engine, flux2_distilled_dir, tmp_path_factory) -> dict[str, object]:
    from tests.helpers.cosmos3_checkpoints import write_tiny_cosmos3
    from tests.helpers.wan_i2v_checkpoints import write_tiny_wan_i2v
    from vidloom.generator import VideoGenerator

    i2v = write_tiny_wan_i2v(tmp_path_factory.mktemp("matrix-i2v"))
    chat = write_tiny_cosmos3(tmp_path_factory.mktemp("matrix-chat") / "cosmos3-tiny")
    return {"t2v": demo_engine, "i2v": VideoGenerator.from_pretrained(i2v, device="cpu").engine,
            "images": VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu").engine,
            "chat": VideoGenerator.from_pretrained(chat, device="cpu").engine}


def _config(data_dir, store: str | None = None) -> ServeConfig:
    return ServeConfig(data_dir=data_dir, store=store, port=0, api_key=KEY, header_timeout_s=1.0,
                       max_connections=MAX_CONNECTIONS, health_port=0, max_body_bytes=4 << 20, queue_size=8,
                       max_steps=BLOCKING_STEPS, graceful_shutdown_s=2, recovery_interval_s=0.5)


@pytest.fixture(scope="module", params=["single", "fleet"])
def api(request, engines, tmp_path_factory) -> Iterator[Api]:
    models = {kind: engine.instance.card.model_id for kind, engine in engines.items()}
    if request.param == "single":
        servers = {k: ThreadServer(e, _config(tmp_path_factory.mktemp(f"single-{k}"))) for k, e in engines.items()}
        try:
            yield Api({k: s.url for k, s in servers.items()}, models, {k: s.health_url for k, s in servers.items()})
        finally:
            for server in servers.values():
                server.stop()
        return
    from tests.helpers.fleet import LocalFleet

    store = request.getfixturevalue("postgres").new_database()
    fleet = LocalFleet([engines[k] for k in KINDS], _config(tmp_path_factory.mktemp("fleet"), store))
    try:
        yield Api({k: fleet.url for k in KINDS}, models, {k: fleet.health_url for k in KINDS})
    finally:
        fleet.stop()


def _png(width: int, height: int, seed: int = 3) -> bytes:
    buffer = io.BytesIO()
    make_image(width, height, seed=seed).save(buffer, format="PNG")
    return buffer.getvalue()


def _decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert code is None or error["code"] == code, error
    return error


# -- the API --------------------------------------------------------------------------------------

def test_videos_create_retrieve_list_content_delete(api: Api):
    oc = api.openai("t2v")
    assert api.models["t2v"] in [m.id for m in oc.models.list().data]
    video = oc.videos.create(prompt="a cat walks", model=api.models["t2v"], size="48x32", seconds="1",
                             extra_body={"num_inference_steps": 2, "num_frames": 5, "seed": 7})
    with api.client() as http:
        done = wait_for_status(http, video.id, {"completed", "failed"})
        assert done["status"] == "completed", done
        assert video.id in [v.id for v in oc.videos.list().data]
        assert oc.videos.download_content(video.id).read()[4:8] == b"ftyp"
        assert http.get(f"/v1/videos/{video.id}/content", params={"variant": "thumbnail"}).content[:4] == b"\x89PNG"
        assert http.get(f"/v1/models/{api.models['t2v']}").json()["id"] == api.models["t2v"]
    assert oc.videos.delete(video.id).deleted
    with pytest.raises(openai.NotFoundError):
        oc.videos.retrieve(video.id)


def test_image_to_video_takes_the_uploaded_image(api: Api):
    oc = api.openai("i2v")
    video = oc.videos.create(prompt="a cat", model=api.models["i2v"], size="48x32",
                             input_reference=("first.png", _png(60, 41), "image/png"),
                             extra_body={"num_frames": 5, "num_inference_steps": 2})
    with api.client("i2v") as http:
        done = wait_for_status(http, video.id, {"completed", "failed"})
        assert done["status"] == "completed", done
        assert done["parameters"]["image"] is True and done["parameters"]["task"] == "i2v"
        form = {"prompt": "a cat", "model": api.models["i2v"], **{k: str(v) for k, v in SMALL.items()}}
        broken = http.post("/v1/videos", data=form, files={"input_reference": ("a.txt", b"hello")})
        assert _error(broken, 400)["param"] == "input_reference"


def test_images_generations_edits_and_url_files(api: Api):
    oc, model = api.openai("images"), api.models["images"]
    result = oc.images.generate(prompt="a lighthouse", model=model, n=2, size="48x32",
                                extra_body={"num_inference_steps": 1, "seed": 5})
    images = [_decode(base64.b64decode(d.b64_json)) for d in result.data]
    assert [im.shape for im in images] == [(32, 48, 3)] * 2
    by_url = oc.images.generate(prompt="a lighthouse", model=model, size="48x32", response_format="url",
                                extra_body={"num_inference_steps": 1, "seed": 5})
    assert by_url.data[0].url.startswith(api.urls["images"])  # the address the client called
    fetched = httpx.get(by_url.data[0].url, headers=AUTH)
    assert fetched.status_code == 200 and np.array_equal(_decode(fetched.content), images[0])
    edit = oc.images.edit(image=("a.png", _png(64, 64), "image/png"), prompt="make it purple", model=model,
                          extra_body={"num_inference_steps": 1, "seed": 2})
    assert _decode(base64.b64decode(edit.data[0].b64_json)).shape == (64, 64, 3)
    with api.client("images") as http:
        no_image = http.post("/v1/images/edits", data={"prompt": "x", "model": model},
                             files=[("other", ("a.txt", b"x", "text/plain"))])
        assert _error(no_image, 400)["param"] == "other"


def test_chat_completions_whole_and_streamed(api: Api):
    oc, model = api.openai("chat"), api.models["chat"]
    hello = [{"role": "user", "content": "tell me a story about robots"}]
    whole = oc.chat.completions.create(model=model, messages=hello, max_tokens=8, temperature=0)
    assert whole.object == "chat.completion" and whole.usage.completion_tokens >= 1
    chunks = list(oc.chat.completions.create(model=model, messages=hello, max_tokens=8, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    with api.client("chat") as http:
        bad = http.post("/v1/chat/completions", json={"model": model, "messages": hello, "max_tokens": 0})
        assert _error(bad, 400)["param"] == "max_tokens"


# -- bad input and limits ---------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "param"), [
    ({"num_inference_steps": 10**6}, "num_inference_steps"),
    ({"size": "50x32"}, "size"),
    ({"seconds": "abc", "num_frames": None}, "seconds"),
])
def test_bad_video_fields_are_400_naming_them(api: Api, body, param):
    fields = {k: v for k, v in {"prompt": "a cat", **SMALL, **body}.items() if v is not None}
    with api.client() as http:
        assert _error(http.post("/v1/videos", json=fields), 400)["param"] == param
        assert _error(http.post("/v1/videos", content=b"{not json", headers={"content-type": "application/json"}),
                      400)
        assert http.get("/health").status_code == 200


def test_unknown_model_is_404(api: Api):
    with api.client() as http:
        assert _error(http.post("/v1/videos", json={"prompt": "x", "model": "sora-2"}), 404, "model_not_found")
        assert _error(http.get("/v1/models/sora-2"), 404, "model_not_found")


def test_the_playground_and_each_models_capabilities_are_served(api: Api):
    """The web playground at / (on for a loopback bind) and what it builds its form from: GET /v1/models/{id}
    with `capabilities`, which on the fleet comes from a replica of that model."""
    page = httpx.get(f"{api.urls['t2v']}/")  # the page holds no data: no key needed, it asks for one
    assert page.status_code == 200 and "text/html" in page.headers["content-type"], page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    script = httpx.get(f"{api.urls['t2v']}/ui/app.js")
    assert script.status_code == 200 and "/v1/models" in script.text
    with api.client() as http:
        assert http.get("/v1/models").status_code == 200
    for kind, expected in (("t2v", {"videos": True, "chat": False}), ("images", {"images": True, "videos": False}),
                           ("chat", {"chat": True})):
        with api.client(kind) as http:
            details = http.get(f"/v1/models/{api.models[kind]}")
        assert details.status_code == 200, details.text
        body = details.json()
        assert body["id"] == api.models[kind]
        caps = body["capabilities"]
        assert {key: caps[key] for key in expected} == expected, (kind, caps)
        assert caps["limits"]["max_steps"] == BLOCKING_STEPS  # this server's (the replica's) limits
    assert httpx.get(f"{api.urls['t2v']}/v1/models/{api.models['t2v']}").status_code == 401  # the API needs it


def test_too_large_body_is_413_and_missing_key_is_401(api: Api):
    with api.client() as http:
        big = http.post("/v1/videos", json={"prompt": "x" * (5 << 20)})
        assert str(4 << 20) in _error(big, 413, "request_too_large")["message"]
    refused = httpx.post(f"{api.urls['t2v']}/v1/videos", json={"prompt": "x"})
    _error(refused, 401, "invalid_api_key")
    assert refused.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{api.urls['t2v']}/health").status_code == 200  # probes need no key


# -- connections ----------------------------------------------------------------------------------

def _address(url: str) -> tuple[str, int]:
    return "127.0.0.1", int(url.rsplit(":", 1)[1])


def test_slowloris_is_disconnected(api: Api):
    with socket.create_connection(_address(api.urls["t2v"]), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/videos HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed = False
        while not closed and time.monotonic() - started < 5:
            try:
                sock.sendall(b"X-Slow: 1\r\n")
                sock.settimeout(0.3)
                closed = sock.recv(1024) == b""
            except socket.timeout:
                continue
            except OSError:
                closed = True
        elapsed = time.monotonic() - started
    assert closed and elapsed < 2.5, f"still open after {elapsed:.1f}s (header_timeout_s=1)"


def test_idle_connections_are_capped_and_health_answers(api: Api):
    with open_connections(api.urls["t2v"], 5 * MAX_CONNECTIONS) as idle:
        with api.client() as http:
            assert http.get("/health").status_code == 200
            assert http.get("/v1/videos").status_code == 200
        time.sleep(0.2)
        still_open = sum(held_open(sock) for sock in idle)
        assert still_open <= MAX_CONNECTIONS, f"{still_open} idle connections held, max_connections={MAX_CONNECTIONS}"


def test_health_port_answers_probes_only(api: Api):
    health = httpx.get(f"{api.health_urls['t2v']}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert httpx.get(f"{api.health_urls['t2v']}/metrics").status_code == 200
    assert httpx.get(f"{api.health_urls['t2v']}/v1/videos", headers=AUTH).status_code == 404


def test_a_client_that_leaves_an_image_render_cancels_it(api: Api):
    import re

    body = {"prompt": "a cat", "model": api.models["images"], "size": "48x32", "num_inference_steps": BLOCKING_STEPS}
    with api.client("images") as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/images/generations", json=body, timeout=1.0)
        cancelled = re.compile(r'vidloom_requests_total\{kind="image",status="cancelled"[^}]*\} 1\.0')
        deadline = time.monotonic() + 15
        while not cancelled.search(http.get("/metrics").text):  # the fleet's replicas publish every ~0.25 s
            assert time.monotonic() < deadline, "the render kept running after its client left"
            time.sleep(0.1)
