"""Keys with roles and owners: a user key sees, streams, cancels and deletes only its owner's jobs (others' ids
answer 404 like missing ones), cannot touch adapters; an admin key sees every job; /metrics carries no prompt."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import BlockingJob, create_video, wait_for_status
from vidloom.serving.api_keys import ApiKey

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ALICE, BOB, ROOT = "sk-alice-0123", "sk-bob-4567", "sk-root-89ab"
SECRET_PROMPT = "alice's secret storyboard: a heron on a red bridge"


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {key}"})


def _not_found(response: httpx.Response, code: str = "video_not_found") -> None:
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == code


@pytest.fixture
def three_keys(start_server, tmp_path: Path):
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# key role owner\n{ALICE} user alice\n{BOB} user bob\n")
    server = start_server(api_keys_file=keys, api_keys=(ApiKey(ROOT, "admin", "ops"),), lora_dirs=(tmp_path,))
    with _client(server.url, ALICE) as alice, _client(server.url, BOB) as bob, _client(server.url, ROOT) as root:
        yield server, alice, bob, root


def test_a_user_key_cannot_see_stream_cancel_or_delete_another_owners_job(three_keys):
    server, alice, bob, root = three_keys
    with BlockingJob(alice, prompt=SECRET_PROMPT) as job:
        missing = "video_" + "0" * 32
        for path in (job.id, missing):  # another owner's id answers exactly as a missing one
            _not_found(bob.get(f"/v1/videos/{path}"))
            _not_found(bob.get(f"/v1/videos/{path}/content"))
            _not_found(bob.get(f"/v1/videos/{path}/content", params={"variant": "stream"}))
            _not_found(bob.get(f"/v1/videos/{path}/events"))
            _not_found(bob.post(f"/v1/videos/{path}/cancel"))
            _not_found(bob.delete(f"/v1/videos/{path}"))
        assert bob.get(f"/v1/videos/{job.id}").json()["error"]["message"].endswith(f"{job.id!r}")
        assert bob.get("/v1/videos").json()["data"] == []
        bad_cursor = bob.get("/v1/videos", params={"after": job.id})
        assert bad_cursor.status_code == 400 and bad_cursor.json()["error"]["param"] == "after"
        assert alice.get(f"/v1/videos/{job.id}").json()["status"] == "in_progress", "bob's calls touched it"
        assert [v["id"] for v in alice.get("/v1/videos").json()["data"]] == [job.id]
        assert [v["id"] for v in root.get("/v1/videos").json()["data"]] == [job.id]  # an admin sees every job
        metrics = httpx.get(f"{server.url}/metrics").text
        assert "heron" not in metrics and "storyboard" not in metrics
    mine = create_video(bob)
    assert wait_for_status(bob, mine["id"], {"completed"})["status"] == "completed"
    assert [v["id"] for v in bob.get("/v1/videos").json()["data"]] == [mine["id"]]
    _not_found(alice.get(f"/v1/videos/{mine['id']}/content"))
    assert root.get(f"/v1/videos/{mine['id']}/content").status_code == 200
    assert root.delete(f"/v1/videos/{mine['id']}").json()["deleted"] is True


def test_a_user_key_cannot_download_another_owners_image_file(three_keys):
    _, alice, bob, root = three_keys
    made = alice.post("/v1/images/generations", json={"prompt": SECRET_PROMPT, "response_format": "url",
                                                      "size": "32x32", "num_inference_steps": 1})
    assert made.status_code == 200, made.text
    path = "/v1/images/files/" + made.json()["data"][0]["url"].rsplit("/", 1)[1]
    assert alice.get(path).status_code == 200
    assert root.get(path).status_code == 200  # an admin sees every owner's files
    missing = bob.get("/v1/images/files/img_" + "0" * 32 + ".png")
    refused = bob.get(path)  # another owner's file answers exactly as a missing one
    assert refused.status_code == 404 and refused.json() == missing.json()


def test_only_an_admin_key_may_load_or_unload_adapters(three_keys, tmp_path: Path):
    _, alice, _, root = three_keys
    for response in (alice.post("/v1/loras", json={"name": "x", "path": "x.safetensors"}),
                     alice.delete("/v1/loras/x")):
        assert response.status_code == 403, response.text
        assert response.json()["error"]["code"] == "insufficient_permissions"
    assert alice.get("/v1/loras").json()["data"] == []  # listing is open to users: requests name adapters
    tried = root.post("/v1/loras", json={"name": "x", "path": "x.safetensors"})
    assert tried.json()["error"]["code"] == "lora_file_not_found", tried.text  # past the role check


def test_the_single_api_key_stays_an_admin(start_server, tmp_path: Path):
    keys = tmp_path / "keys.json"
    keys.write_text(f'[{{"key": "{ALICE}", "role": "user", "owner": "alice"}}]')
    server = start_server(api_key=ROOT, api_keys_file=keys)
    with _client(server.url, ALICE) as alice, _client(server.url, ROOT) as root:
        video = create_video(alice)
        assert root.get(f"/v1/videos/{video['id']}").status_code == 200
        wait_for_status(alice, video["id"], {"completed"})
        own = create_video(root)
        _not_found(alice.get(f"/v1/videos/{own['id']}"))
        wait_for_status(root, own["id"], {"completed"})


@pytest.fixture(scope="module")
def session_server(cosmos3_action_dir: Path, tmp_path_factory):
    from tests.helpers.servers import ThreadServer
    from vidloom.generator import VideoGenerator
    from vidloom.serving.config import ServeConfig

    generator = VideoGenerator.from_pretrained(cosmos3_action_dir, device="cpu")
    keys = (ApiKey(ALICE, "user", "alice"), ApiKey(BOB, "user", "bob"), ApiKey(ROOT, "admin", "ops"))
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("keyed-sessions"), graceful_shutdown_s=2, api_keys=keys)
    with ThreadServer(generator.engine, config) as server:
        yield server


def _socket_answer(server, session_id: str, key: str) -> tuple[dict, int]:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + f"/v1/sessions/{session_id}/ws"
    with connect(url, open_timeout=10, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        first = json.loads(ws.recv(timeout=10))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        return first, ws.close_code


def test_a_user_key_cannot_see_drive_or_close_another_owners_session(session_server):
    import base64
    import io

    import numpy as np
    from PIL import Image

    picture = io.BytesIO()
    Image.fromarray(np.zeros((48, 64, 3), dtype=np.uint8)).save(picture, format="PNG")
    body = {"prompt": SECRET_PROMPT, "domain_name": "pusht", "chunk_size": 4, "resolution_tier": 256,
            "num_inference_steps": 2, "input_reference": "data:image/png;base64,"
            + base64.b64encode(picture.getvalue()).decode()}
    server = session_server
    with _client(server.url, ALICE) as alice, _client(server.url, BOB) as bob, _client(server.url, ROOT) as root:
        opened = alice.post("/v1/sessions", json=body)
        assert opened.status_code == 200, opened.text
        session_id, missing = opened.json()["id"], "sess_" + "0" * 32
        try:
            for probe in (bob.get(f"/v1/sessions/{session_id}"), bob.delete(f"/v1/sessions/{session_id}")):
                _not_found(probe, "session_not_found")
                assert probe.json()["error"]["message"] == bob.get(f"/v1/sessions/{missing}").json()["error"][
                    "message"].replace(missing, session_id)
            refused, code = _socket_answer(server, session_id, BOB)
            assert code == 4404 and refused == _socket_answer(server, missing, BOB)[0]
            assert server.app.state.sessions.find(session_id) is not None, "bob's socket closed alice's session"
            assert alice.get(f"/v1/sessions/{session_id}").json()["prompt"] == SECRET_PROMPT
            assert root.get(f"/v1/sessions/{session_id}").status_code == 200  # an admin sees every session
        finally:
            assert alice.delete(f"/v1/sessions/{session_id}").status_code == 200
