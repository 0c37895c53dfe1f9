"""The Ray Serve fleet: a local CPU-only Ray, two demo replicas behind the ingress, the official openai client.

One fleet for the module (starting Ray and two replicas takes ~30-60 s on 2 cores); each wait is bounded.
The full request matrix runs in test_api_matrix.py (in-process replicas); here the same ingress reaches
its replicas through Ray Serve's handles, with Ray's own HTTP proxy off.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.helpers.servers import SMALL, held_open, open_connections, wait_for_status

ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MAX_CONNECTIONS = 8


def _fleet_card(tmp: Path, url: str) -> Path:
    card = tmp / "fleet.yaml"
    card.write_text(f"""
store: {url}
data_dir: {tmp / "data"}
port: 0
health_port: 0
header_timeout_s: 1
max_connections: {MAX_CONNECTIONS}
recovery_interval_s: 0.5
max_steps: 2000
fleet:
  num_cpus: 3
  object_store_mb: 100
  health_check_period_s: 2
  graceful_shutdown_s: 3
  models:
    - model: wan2.1-demo
      replicas: 2
      num_cpus: 1
      device: cpu
""")
    return card


@pytest.fixture(scope="module")
def fleet_server(postgres, demo_cache: Path, tmp_path_factory) -> Iterator[tuple[object, str]]:
    """(the running FleetServer, the shared store's URL)."""
    import os

    from vidloom.fleet.cli import start_fleet, stop_fleet
    from vidloom.fleet.config import load_fleet_card

    saved = {k: os.environ.get(k) for k in ("VIDLOOM_CACHE", "RAY_AUTH_MODE")}
    os.environ["VIDLOOM_CACHE"] = str(demo_cache)  # Ray workers inherit the environment
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a throwaway local cluster on loopback
    tmp = tmp_path_factory.mktemp("fleet")
    store = postgres.new_database()
    card = load_fleet_card(_fleet_card(tmp, store))
    server = start_fleet(card, log_level="warning")
    _CARDS.append(card)
    try:
        _wait_for_replicas(server.url, 2, timeout=120)
        yield server, store
    finally:
        stop_fleet(server)
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_CARDS: list = []  # the module fleet's card, for the scaling test


@pytest.fixture
def fleet_and_store(fleet_server: tuple[object, str]) -> tuple[str, str]:
    """(the ingress URL, the shared store's URL)."""
    return fleet_server[0].url, fleet_server[1]  # type: ignore[attr-defined]


@pytest.fixture
def fleet(fleet_and_store: tuple[str, str]) -> str:
    return fleet_and_store[0]


def _wait_for_replicas(url: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).json()["models"]["wan2.1-demo"] >= count:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the fleet did not report {count} live replicas in {timeout}s")


def test_the_openai_client_creates_polls_lists_downloads_and_deletes(fleet: str, tmp_path: Path):
    client = openai.OpenAI(base_url=f"{fleet}/v1", api_key="unused", timeout=60)
    assert [m.id for m in client.models.list().data] == ["wan2.1-demo"]
    video = client.videos.create(prompt="a cat walks", model="wan2.1-demo", size="48x32", seconds="1",
                                 extra_body={"num_inference_steps": 2, "num_frames": 5})
    assert video.status == "queued"
    deadline = time.monotonic() + 60
    while (video := client.videos.retrieve(video.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline, video
        time.sleep(0.1)
    assert video.status == "completed", video
    assert video.id in [v.id for v in client.videos.list().data]
    content = client.videos.download_content(video.id)
    assert content.read()[4:8] == b"ftyp"
    assert client.videos.delete(video.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)
    with httpx.Client(base_url=fleet, timeout=30) as http:
        wrong = http.post("/v1/videos", json={"prompt": "x", "model": "sora-2"})
        assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
        bad = http.post("/v1/videos", json={"prompt": "x", "size": "48x32", "num_inference_steps": 99999})
        assert bad.status_code == 400 and "num_inference_steps" in bad.json()["error"]["message"]  # the replica's check


def test_events_and_cancel_reach_the_job_on_whichever_replica_runs_it(fleet: str):
    with httpx.Client(base_url=fleet, timeout=30) as http:
        job = http.post("/v1/videos", json={"prompt": "long", **SMALL, "num_inference_steps": 1500}).json()["id"]
        wait_for_status(http, job, {"in_progress"}, timeout=30)
        events: list[str] = []
        with http.stream("GET", f"/v1/videos/{job}/events") as stream:
            for line in stream.iter_lines():
                if line.startswith("event:"):
                    events.append(line.split(":", 1)[1].strip())
                    if len(events) == 2:  # streaming: now cancel through the ingress
                        assert http.post(f"/v1/videos/{job}/cancel").status_code == 200
        assert events[0] == "progress" and events[-1] == "cancelled", events
        metrics = http.get("/metrics").text
        assert 'vidloom_fleet_replicas{model="wan2.1-demo"} 2' in metrics
        assert metrics.count('vidloom_queue_depth{replica="model0#') == 2  # both replicas' metrics, joined


def test_uploads_images_and_chat_reach_the_replica_as_the_single_server_takes_them(fleet: str, tmp_path: Path):
    import io

    import numpy as np
    from PIL import Image

    from vidloom.media.video import write_video

    png = io.BytesIO()
    Image.fromarray(np.full((32, 48, 3), 90, np.uint8)).save(png, format="PNG")
    form = {"prompt": "a cat", **{k: str(v) for k, v in SMALL.items()}}
    with httpx.Client(base_url=fleet, timeout=60) as http:
        # A text-to-video model refuses an image by name: the file arrived (not the string "upload").
        image = http.post("/v1/videos", data=form, files={"input_reference": ("a.png", png.getvalue())})
        assert image.status_code == 400 and "does not accept" in image.json()["error"]["message"], image.text
        clip = np.full((5, 32, 48, 3), 120, np.uint8)
        mp4 = write_video(clip, 8, tmp_path / "in.mp4").read_bytes()
        v2v = http.post("/v1/videos", data={**form, "strength": "0.5"}, files={"video": ("in.mp4", mp4)})
        assert v2v.status_code == 200, v2v.text
        assert wait_for_status(http, v2v.json()["id"], {"completed", "failed"}, timeout=60)["status"] == "completed"
        picture = http.post("/v1/images/generations", json={"prompt": "a cat", "size": "48x32",
                                                             "num_inference_steps": 2, "response_format": "url"})
        assert picture.status_code == 200, picture.text
        assert http.get(picture.json()["data"][0]["url"]).content[:4] == b"\x89PNG"
        chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "model", chat.text  # not a 404


def test_a_client_that_leaves_an_image_render_cancels_it_on_the_replica(fleet: str):
    import re

    body = {"prompt": "a cat", "size": "48x32", "num_inference_steps": 2000}
    with httpx.Client(base_url=fleet, timeout=30) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/images/generations", json=body, timeout=2.0)
        cancelled = re.compile(r'vidloom_requests_total\{kind="image",status="cancelled"[^}]*\} 1\.0')
        deadline = time.monotonic() + 20
        while not cancelled.search(http.get("/metrics").text):  # Ray's stream cancel reached the route
            assert time.monotonic() < deadline, "the render kept running after its client left"
            time.sleep(0.2)


def test_the_ingress_applies_the_connection_limits(fleet_server: tuple[object, str]):
    import socket

    server = fleet_server[0]
    port = int(server.url.rsplit(":", 1)[1])  # type: ignore[attr-defined]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
        slow.sendall(b"POST /v1/videos HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow.settimeout(3)
        started = time.monotonic()
        assert slow.recv(1024) == b"" and time.monotonic() - started < 2.5  # header_timeout_s: 1
    with open_connections(server.url, 5 * MAX_CONNECTIONS) as idle:  # type: ignore[attr-defined]
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200  # type: ignore[attr-defined]
        time.sleep(0.2)
        held = sum(held_open(sock) for sock in idle)
        assert held <= MAX_CONNECTIONS, f"{held} idle connections held"
    assert httpx.get(f"{server.health_url}/health", timeout=5).status_code == 200  # type: ignore[attr-defined]
    from ray import serve

    assert not serve.status().proxies  # Ray's own HTTP proxy is off: nothing bypasses these limits


def _owners(url: str, ids: list[str]) -> dict[str, str]:
    """Job id -> name of the replica running it (from the shared store)."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT j.id, s.name FROM jobs j JOIN servers s ON s.owner = j.owner "
                            "WHERE j.id = ANY(%s)", (ids,)).fetchall()
    return dict(rows)


def test_a_killed_replica_fails_only_its_own_jobs(fleet_and_store: tuple[str, str]):
    fleet, store_url = fleet_and_store
    with httpx.Client(base_url=fleet, timeout=30) as http:
        long = http.post("/v1/videos", json={"prompt": "long", **SMALL, "num_inference_steps": 1500}).json()["id"]
        wait_for_status(http, long, {"in_progress"}, timeout=30)
        short = [http.post("/v1/videos", json={"prompt": f"short {i}", **SMALL}).json()["id"] for i in range(4)]
        owners = _owners(store_url, [long, *short])
        victim = owners[long]
        _kill_replica(victim)
        final = {j: wait_for_status(http, j, {"completed", "failed", "cancelled"}, timeout=60) for j in [long, *short]}
    assert final[long]["status"] == "failed" and final[long]["error"]["code"] == "server_restart", final[long]
    for job in short:
        expected = "failed" if owners.get(job) == victim else "completed"
        assert final[job]["status"] == expected, (job, owners, final[job])
    assert any(owners.get(j) != victim for j in short), owners  # the other replica took work


def _kill_replica(name: str) -> None:
    """`ray.kill` the Serve replica actor called `deployment#id` (as kill -9 would: no shutdown code runs)."""
    unique = name.split("#", 1)[1]
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].endswith(f"#{unique}"):
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=False)
            return
    raise LookupError(f"no Ray actor for replica {name}")


def test_scaling_down_keeps_completed_jobs_and_keeps_serving(fleet: str):
    """Runs last: one replica is stopped gracefully; completed jobs and the API stay."""
    import dataclasses

    from vidloom.fleet.ray_app import deploy_replicas

    with httpx.Client(base_url=fleet, timeout=30) as http:
        done = [http.post("/v1/videos", json={"prompt": f"keep {i}", **SMALL}).json()["id"] for i in range(2)]
        for job in done:
            assert wait_for_status(http, job, {"completed", "failed"}, timeout=60)["status"] == "completed"
        card = _CARDS[0]
        (model,) = card.fleet.models
        smaller = dataclasses.replace(card.fleet, models=(dataclasses.replace(model, replicas=1),))
        deploy_replicas(dataclasses.replace(card, fleet=smaller))  # redeploys the model: 2 -> 1 replica
        _wait_for_replicas_exactly(fleet, 1, timeout=60)
        for job in done:
            assert http.get(f"/v1/videos/{job}").json()["status"] == "completed"
            assert http.get(f"/v1/videos/{job}/content").content[4:8] == b"ftyp"
        after = http.post("/v1/videos", json={"prompt": "after", **SMALL}).json()["id"]
        assert wait_for_status(http, after, {"completed", "failed"}, timeout=60)["status"] == "completed"


def _wait_for_replicas_exactly(url: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(f"{url}/health", timeout=5).json()["models"]["wan2.1-demo"] != count:
        assert time.monotonic() < deadline, f"the fleet never settled at {count} replica(s)"
        time.sleep(0.5)
