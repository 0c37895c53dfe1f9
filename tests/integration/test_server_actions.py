"""POST /v1/videos with an `action` block on a tiny Cosmos3 folder with the action pathway.

The job's predicted actions equal the Python API's for the same request, and come back as JSON and as a
float32 .npy through content variants; every bad block is a 400 naming the field.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.servers import ThreadServer, wait_for_status
from vidloom import ActionInput
from vidloom.serving.config import ServeConfig

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
PROMPT = "push the block"
BLOCK = {"mode": "policy", "domain_name": "pusht", "chunk_size": 4, "resolution_tier": 256}


def _png() -> bytes:
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def served(cosmos3_action_dir: Path, tmp_path_factory):
    from vidloom.generator import VideoGenerator

    generator = VideoGenerator.from_pretrained(cosmos3_action_dir, device="cpu")
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("action-data"), graceful_shutdown_s=2)
    with ThreadServer(generator.engine, config) as server:
        yield server, generator


def _post(client: httpx.Client, block: object, **fields: object) -> httpx.Response:
    form = {"prompt": PROMPT, "num_inference_steps": "2", "seed": "4",
            "action": block if isinstance(block, str) else json.dumps(block), **{k: str(v) for k, v in fields.items()}}
    return client.post("/v1/videos", data=form, files={"input_reference": ("first.png", _png(), "image/png")})


def test_policy_job_returns_the_actions_as_json_and_npy(served):
    server, generator = served
    with httpx.Client(base_url=server.url, timeout=120) as client:
        created = _post(client, BLOCK)
        assert created.status_code == 200, created.text
        job = created.json()
        assert job["size"] == "64x48" and job["parameters"]["action"]["domain_name"] == "pusht"
        done = wait_for_status(client, job["id"], {"completed", "failed"}, timeout=120)
        assert done["status"] == "completed", done
        as_json = client.get(f"/v1/videos/{job['id']}/content", params={"variant": "actions"})
        as_npy = client.get(f"/v1/videos/{job['id']}/content", params={"variant": "actions_npy"})
        video = client.get(f"/v1/videos/{job['id']}/content")
    assert as_json.status_code == as_npy.status_code == video.status_code == 200
    body = as_json.json()
    assert body["shape"] == [4, 2] and body["mode"] == "policy" and body["domain_name"] == "pusht"
    loaded = np.load(io.BytesIO(as_npy.content), allow_pickle=False)
    assert loaded.dtype == np.float32 and loaded.shape == (4, 2)
    assert np.array_equal(np.asarray(body["actions"], dtype=np.float32), loaded)
    image = Image.open(io.BytesIO(_png()))
    api = generator.generate(PROMPT, image=image, num_inference_steps=2, seed=4,
                             action=ActionInput(**BLOCK))
    assert np.abs(api.actions - loaded).max() <= 1e-6


def test_forward_dynamics_job_has_no_actions_to_download(served):
    server, _ = served
    block = {**BLOCK, "mode": "forward_dynamics", "raw_actions": [[0.5, -0.5]] * 4}
    with httpx.Client(base_url=server.url, timeout=120) as client:
        job = _post(client, block).json()
        assert wait_for_status(client, job["id"], {"completed", "failed"}, timeout=120)["status"] == "completed"
        missing = client.get(f"/v1/videos/{job['id']}/content", params={"variant": "actions"})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "variant"


@pytest.mark.parametrize("block, extra, param", [
    ({**BLOCK, "domain_name": "spaceship"}, {}, "action.domain_name"),
    ({**BLOCK, "domain_name": "galbot"}, {}, "action.domain_name"),
    ({**BLOCK, "mode": "forward_dynamics"}, {}, "action.raw_actions"),
    ({**BLOCK, "mode": "forward_dynamics", "raw_actions": [[1, 2, 3]]}, {}, "action.raw_actions"),
    ({**BLOCK, "mode": "inverse_dynamics"}, {}, "video"),
    ({**BLOCK, "chunk_size": 6}, {}, "action.chunk_size"),
    ({**BLOCK, "mode": "fly"}, {}, "action.mode"),
    ({**BLOCK, "view_point": "moon"}, {}, "action.view_point"),
    ({**BLOCK, "colour": "red"}, {}, "action.colour"),
    ("{not json", {}, "action"),
    (BLOCK, {"size": "64x48"}, "size"),
    (BLOCK, {"num_frames": 5}, "num_frames"),
])
def test_bad_action_blocks_are_400_naming_the_field(served, block, extra, param):
    server, _ = served
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = _post(client, block, **extra)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


def test_a_json_body_without_a_first_frame_is_refused(served):
    server, _ = served
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = client.post("/v1/videos", json={"prompt": PROMPT, "action": BLOCK})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input_reference"
