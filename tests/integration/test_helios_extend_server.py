"""Helios extend_from over HTTP: a completed Helios video keeps its latents, and `extend_from: <id>` continues it
as the Python API does (the same frames as generate(extend_from=<its stored session>)); boundary errors name the
field."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers.servers import ThreadServer, wait_for_status
from vidloom.core.session import VideoSession
from vidloom.generator import VideoGenerator
from vidloom.media.video import read_video
from vidloom.serving.config import ServeConfig

SOURCE = {"prompt": "a paper boat", "size": "96x64", "num_frames": 65, "num_inference_steps": 2, "seed": 5}
EXTEND = {"prompt": "the boat reaches the harbour", "num_frames": 33, "num_inference_steps": 2, "seed": 7}


@pytest.fixture(scope="module")
def gen(tmp_path_factory) -> VideoGenerator:
    return VideoGenerator.from_pretrained("helios-demo", device="cpu", cache_dir=tmp_path_factory.mktemp("cache"))


def _run(client: httpx.Client, body: dict) -> dict:
    response = client.post("/v1/videos", json=body)
    assert response.status_code == 200, response.text
    video = wait_for_status(client, response.json()["id"], {"completed", "failed", "cancelled"}, timeout=300)
    assert video["status"] == "completed", video
    return video


def test_server_extension_equals_the_python_extension(gen, tmp_path):
    config = ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=2)
    with ThreadServer(gen.engine, config) as server, httpx.Client(base_url=server.url, timeout=300) as client:
        source = _run(client, SOURCE)
        stored = tmp_path / "data" / "videos" / f"{source['id']}.latents"
        assert stored.is_file()
        extended = _run(client, {**EXTEND, "extend_from": source["id"]})
        assert extended["size"] == "96x64" and extended["metadata"]["num_frames"] == 33
        assert extended["parameters"]["extend_from"] == source["id"]
        served = tmp_path / "served.mp4"
        served.write_bytes(client.get(f"/v1/videos/{extended['id']}/content").content)
        bad = client.post("/v1/videos", json={**EXTEND, "extend_from": "video_nope"})
        assert bad.status_code == 404 and bad.json()["error"]["param"] == "extend_from"
        other = client.post("/v1/videos", json={**EXTEND, "extend_from": source["id"], "size": "64x64"})
        assert other.status_code == 400 and "size" in other.text

        session = VideoSession.load(stored)
    assert session.partition == (9, 9) and session.num_frames == 65
    ours = gen.generate(extend_from=session, **{k: v for k, v in EXTEND.items()})
    ours.save(tmp_path / "python.mp4")
    assert np.array_equal(read_video(served)[0], read_video(tmp_path / "python.mp4")[0])
    assert ours.num_frames == 33
