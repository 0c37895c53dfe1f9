"""extend_from over HTTP on a real uvicorn server with an AnyFlow-FAR model: resident and rebuilt
extensions, boundary errors naming the field, stored latents, delete/cancel freeing the session, /metrics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from tests.helpers.servers import BLOCKING_STEPS, ThreadServer, wait_for_status
from vidloom.core.deploy import DeployConfig
from vidloom.generator import VideoGenerator
from vidloom.media.video import read_video
from vidloom.runtime.engine import Engine
from vidloom.serving.config import ServeConfig

SOURCE = {"prompt": "a red fox runs over snow", "size": "48x32", "num_frames": 9, "num_inference_steps": 2, "seed": 1}
EXTEND = {"prompt": "a cat walks on the ice", "num_frames": 21, "num_inference_steps": 2, "seed": 2}


@pytest.fixture(scope="module")
def far_dir(tmp_path_factory) -> Path:
    return write_tiny_far(tmp_path_factory.mktemp("far-serve"), FAR_A)


def _engine(far_dir: Path, **deploy: object) -> Engine:
    return VideoGenerator.from_pretrained(far_dir, device="cpu",
                                          deploy=DeployConfig(kv_session_ttl_s=600, **deploy)).engine  # type: ignore[arg-type]


def _serve(engine: Engine, data_dir: Path, **settings: object) -> ThreadServer:
    config = ServeConfig(data_dir=data_dir, graceful_shutdown_s=2, max_steps=BLOCKING_STEPS, **settings)  # type: ignore[arg-type]
    return ThreadServer(engine, config)


@pytest.fixture
def far_client(far_dir: Path, tmp_path: Path) -> Iterator[tuple[httpx.Client, Engine, Path]]:
    engine = _engine(far_dir)
    with _serve(engine, tmp_path / "data") as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield client, engine, tmp_path / "data"


def _run(client: httpx.Client, body: dict) -> dict:
    response = client.post("/v1/videos", json=body)
    assert response.status_code == 200, response.text
    video = wait_for_status(client, response.json()["id"], {"completed", "failed", "cancelled"})
    assert video["status"] == "completed", video
    return video


def _frames(client: httpx.Client, video_id: str, tmp_path: Path) -> np.ndarray:
    path = tmp_path / f"{video_id}.mp4"
    path.write_bytes(client.get(f"/v1/videos/{video_id}/content").content)
    return read_video(path)[0]


def test_extension_resident_then_rebuilt_gives_the_same_video(far_client, tmp_path):
    client, engine, data = far_client
    source = _run(client, SOURCE)
    assert (data / "videos" / f"{source['id']}.latents").is_file()
    metrics = client.get("/metrics").text
    assert "vidloom_kv_sessions 1.0" in metrics and "vidloom_kv_cache_budget_bytes +Inf" in metrics

    resident = _run(client, {**EXTEND, "extend_from": source["id"]})
    assert resident["metadata"]["extension"] == {"extend_from": source["id"], "kv": "resident"}
    assert resident["size"] == "48x32" and resident["metadata"]["num_frames"] == 21
    assert resident["parameters"]["extend_from"] == source["id"]
    assert engine.caches.release_session(source["id"])  # evicted
    rebuilt = _run(client, {**EXTEND, "extend_from": source["id"]})
    assert rebuilt["metadata"]["extension"]["kv"] == "rebuilt"
    assert np.array_equal(_frames(client, resident["id"], tmp_path), _frames(client, rebuilt["id"], tmp_path))

    # Deleting a video frees its session and its stored latents at once.
    sessions = engine.caches.session_ids()
    assert resident["id"] in sessions
    assert client.delete(f"/v1/videos/{resident['id']}").status_code == 200
    assert resident["id"] not in engine.caches.session_ids()
    assert not (data / "videos" / f"{resident['id']}.latents").exists()
    for video_id in (source["id"], rebuilt["id"]):
        client.delete(f"/v1/videos/{video_id}")
    assert engine.caches.bytes_in_use == 0
    assert "vidloom_kv_cache_bytes_in_use 0.0" in client.get("/metrics").text


def test_extend_from_is_refused_at_the_boundary(far_client):
    client, _, _ = far_client
    unknown = client.post("/v1/videos", json={**EXTEND, "extend_from": "video_" + "0" * 32})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "extend_from"
    garbage = client.post("/v1/videos", json={**EXTEND, "extend_from": "../../etc/passwd"})
    assert garbage.status_code == 404 and garbage.json()["error"]["param"] == "extend_from"

    running = client.post("/v1/videos", json={**SOURCE, "num_inference_steps": BLOCKING_STEPS}).json()
    try:
        busy = client.post("/v1/videos", json={**EXTEND, "extend_from": running["id"]})
        assert busy.status_code == 409 and busy.json()["error"]["param"] == "extend_from", busy.text
    finally:
        client.delete(f"/v1/videos/{running['id']}")

    source = _run(client, SOURCE)
    for body, param in (({"size": "64x32"}, "size"), ({"num_frames": 9}, "num_frames"),
                        ({"guidance_scale": 3.0}, "guidance_scale")):
        refused = client.post("/v1/videos", json={**EXTEND, **body, "extend_from": source["id"]})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    client.delete(f"/v1/videos/{source['id']}")


def test_cancelled_extension_frees_its_slab(far_client):
    client, engine, _ = far_client
    source = _run(client, SOURCE)
    held = engine.caches.bytes_in_use
    job = client.post("/v1/videos", json={**EXTEND, "num_inference_steps": BLOCKING_STEPS,
                                          "extend_from": source["id"]}).json()
    wait_for_status(client, job["id"], {"in_progress"})
    assert client.post(f"/v1/videos/{job['id']}/cancel").status_code == 200
    wait_for_status(client, job["id"], {"cancelled"})
    assert engine.caches.bytes_in_use == held and engine.caches.session_stats()["pinned"] == 0
    client.delete(f"/v1/videos/{source['id']}")
    assert engine.caches.bytes_in_use == 0


def test_after_a_restart_the_extension_rebuilds_from_stored_latents(far_dir, tmp_path):
    data = tmp_path / "data"
    with _serve(_engine(far_dir), data) as first, httpx.Client(base_url=first.url, timeout=30) as client:
        source = _run(client, SOURCE)
        resident = _run(client, {**EXTEND, "extend_from": source["id"]})
        expected = _frames(client, resident["id"], tmp_path)
    with _serve(_engine(far_dir), data) as second, httpx.Client(base_url=second.url, timeout=30) as client:
        rebuilt = _run(client, {**EXTEND, "extend_from": source["id"]})
        assert rebuilt["metadata"]["extension"]["kv"] == "rebuilt"
        assert np.array_equal(_frames(client, rebuilt["id"], tmp_path), expected)
    # Another model's server (here: the same weights under another served name) refuses the source.
    with _serve(_engine(far_dir), data, served_model_name="other-far") as third, \
            httpx.Client(base_url=third.url, timeout=30) as client:
        refused = client.post("/v1/videos", json={**EXTEND, "extend_from": source["id"]})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "extend_from", refused.text
        assert "was made by" in refused.json()["error"]["message"]


def test_a_non_causal_model_refuses_extend_from(client):
    """The shared demo (Wan2.1 T2V) server of conftest."""
    refused = client.post("/v1/videos", json={"prompt": "a cat", "extend_from": "video_" + "0" * 32})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "extend_from", refused.text
    assert "not a chunked video model" in refused.json()["error"]["message"]


def test_idle_sessions_expire_on_the_server_without_any_request(far_dir, tmp_path):
    engine = _engine(far_dir)
    engine.caches.session_ttl_s = 0.3  # short, for the test (the deployment's value is read at start)
    with _serve(engine, tmp_path / "data") as server, httpx.Client(base_url=server.url, timeout=30) as client:
        _run(client, SOURCE)
        deadline = time.monotonic() + 5
        # Read the counter only: every CacheManager query would expire sessions itself.
        while engine.caches.expirations == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.caches.expirations == 1 and engine.caches.bytes_in_use == 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks the Sora API deprecated
def test_the_official_openai_client_extends_a_video(far_client):
    from openai import OpenAI

    client, engine, _ = far_client
    openai = OpenAI(base_url=f"{str(client.base_url).rstrip('/')}/v1", api_key="unused")
    source = openai.videos.create_and_poll(prompt=SOURCE["prompt"], size="48x32", extra_body={
        "num_frames": 9, "num_inference_steps": 2, "seed": 1}, poll_interval_ms=50)
    assert source.status == "completed", source.error
    longer = openai.videos.create_and_poll(prompt="a cat walks on the ice", extra_body={
        "extend_from": source.id, "num_frames": 21, "num_inference_steps": 2, "seed": 2}, poll_interval_ms=50)
    assert longer.status == "completed", longer.error
    assert longer.size == "48x32" and engine.caches.session_stats()["sessions"] == 2
    openai.videos.delete(source.id)
    openai.videos.delete(longer.id)
    assert engine.caches.bytes_in_use == 0
