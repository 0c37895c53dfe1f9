"""The video job API as clients use it: httpx (JSON and multipart) and the official openai package."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import av
import httpx
import numpy as np
import pytest

from tests.helpers.servers import SMALL, BlockingJob, create_video, wait_for_status
from vidloom.diffusion.scheduler_keys import UNIPC_POLICY
from vidloom.media.video import read_video

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks the Sora API deprecated


def _png(data: bytes) -> np.ndarray:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with av.open(io.BytesIO(data)) as container:
        return next(container.decode(video=0)).to_ndarray(format="rgb24")


def test_job_lifecycle(client: httpx.Client, tmp_path: Path):
    video = create_video(client, prompt="a red fox in the snow")
    assert video["object"] == "video" and video["status"] == "queued" and video["progress"] == 0
    assert video["id"].startswith("video_") and video["model"] == "wan2.1-demo"
    assert video["size"] == "48x32" and video["seconds"] == "0.625"  # 5 frames at the demo's 8 fps
    assert isinstance(video["created_at"], int) and video["completed_at"] is None

    done = wait_for_status(client, video["id"], {"completed", "failed"})
    assert done["status"] == "completed" and done["progress"] == 100 and done["error"] is None
    assert done["completed_at"] >= done["created_at"]
    assert done["parameters"]["seed"] == 7 and done["parameters"]["num_inference_steps"] == 2
    assert done["parameters"]["guidance_scale"] == 5.0  # card default filled in
    assert done["metadata"]["elapsed_s"] > 0

    content = client.get(f"/v1/videos/{video['id']}/content")
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    (tmp_path / "out.mp4").write_bytes(content.content)
    frames, fps = read_video(tmp_path / "out.mp4")
    assert frames.shape == (5, 32, 48, 3) and fps == 8

    thumb = client.get(f"/v1/videos/{video['id']}/content", params={"variant": "thumbnail"})
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/png"
    assert _png(thumb.content).shape == (32, 48, 3)

    listed = client.get("/v1/videos", params={"limit": 100}).json()
    assert video["id"] in [v["id"] for v in listed["data"]]

    deleted = client.delete(f"/v1/videos/{video['id']}")
    assert deleted.json() == {"id": video["id"], "object": "video.deleted", "deleted": True}
    assert client.get(f"/v1/videos/{video['id']}").status_code == 404
    assert client.get(f"/v1/videos/{video['id']}/content").status_code == 404


def test_multipart_create_and_the_seconds_rule(client: httpx.Client):
    form = {"prompt": "waves crash", "size": "48x32", "seconds": "1", "num_inference_steps": "2", "seed": "3"}
    multipart = {name: (None, value) for name, value in form.items()}  # fields without a filename
    response = client.post("/v1/videos", files=multipart)
    assert response.request.headers["content-type"].startswith("multipart/form-data")
    video = response.json()
    # 1 s at 8 fps = 8 frames, snapped to the nearest 4k+1 = 9; the actual duration is reported.
    assert video["parameters"]["num_frames"] == 9 and video["seconds"] == "1.125"
    assert video["parameters"]["seed"] == 3

    half = client.post("/v1/videos", files={**multipart, "seconds": (None, "0.5")}).json()
    assert half["parameters"]["num_frames"] == 5 and half["seconds"] == "0.625"

    both = create_video(client, seconds="4", num_frames=5)  # num_frames wins
    assert both["parameters"]["num_frames"] == 5 and both["seconds"] == "0.625"

    fps = create_video(client, num_frames=None, seconds=2, fps=4)  # 8 frames -> 9 at 4 fps
    assert fps["parameters"]["num_frames"] == 9 and fps["seconds"] == "2.25"
    for v in (video, half, both, fps):
        assert wait_for_status(client, v["id"], {"completed", "failed"})["status"] == "completed"


def test_openai_client_videos(server, tmp_path: Path):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0)
    extra = {k: v for k, v in SMALL.items() if k != "size"}
    video = client.videos.create(prompt="a cat", size="48x32", seconds="1", extra_body=extra)
    assert video.status == "queued" and video.size == "48x32" and video.seconds == "0.625"

    with httpx.Client(base_url=server.url) as http:
        wait_for_status(http, video.id, {"completed", "failed"})
    video = client.videos.retrieve(video.id)
    assert video.status == "completed" and video.progress == 100 and video.completed_at is not None

    page = client.videos.list(limit=100, order="desc")
    assert video.id in [v.id for v in page.data]

    content = client.videos.download_content(video.id)
    content.write_to_file(tmp_path / "clip.mp4")
    frames, _ = read_video(tmp_path / "clip.mp4")
    assert frames.shape == (5, 32, 48, 3)
    thumbnail = client.videos.download_content(video.id, variant="thumbnail")
    assert _png(thumbnail.read()).shape == (32, 48, 3)

    deleted = client.videos.delete(video.id)
    assert deleted.deleted and deleted.id == video.id and deleted.object == "video.deleted"
    with pytest.raises(openai.NotFoundError) as excinfo:
        client.videos.retrieve(video.id)
    assert excinfo.value.body["code"] == "video_not_found"


def test_list_pagination(client: httpx.Client):
    ids = [create_video(client)["id"] for _ in range(3)]
    for video_id in ids:
        wait_for_status(client, video_id, {"completed"})
    newest = client.get("/v1/videos", params={"limit": 2}).json()  # default order: desc
    assert newest["object"] == "list" and [v["id"] for v in newest["data"]] == ids[::-1][:2]
    assert newest["first_id"] == ids[2] and newest["last_id"] == ids[1] and newest["has_more"] is True

    rest = client.get("/v1/videos", params={"limit": 2, "after": newest["last_id"]}).json()
    assert rest["data"][0]["id"] == ids[0]

    asc = client.get("/v1/videos", params={"order": "asc", "after": ids[0], "limit": 100}).json()
    assert [v["id"] for v in asc["data"]][:2] == ids[1:] and asc["has_more"] is False

    unknown = client.get("/v1/videos", params={"after": "video_" + "0" * 32})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "after"


def test_content_before_completion_is_409(client: httpx.Client):
    with BlockingJob(client) as job:
        response = client.get(f"/v1/videos/{job.id}/content")
        assert response.status_code == 409
        error = response.json()["error"]
        assert error["code"] == "video_not_ready" and "in_progress" in error["message"]


def test_images_endpoint_returns_a_png(server, client: httpx.Client):
    body = {"prompt": "a lighthouse", "size": "48x32", "num_inference_steps": 2, "seed": 1}
    response = client.post("/v1/images/generations", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert isinstance(result["created"], int) and len(result["data"]) == 1
    assert _png(base64.b64decode(result["data"][0]["b64_json"])).shape == (32, 48, 3)

    for field, value in (("n", 11), ("response_format", "svg"), ("size", "50x32")):
        bad = client.post("/v1/images/generations", json={**body, field: value})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == field

    openai = pytest.importorskip("openai")
    oc = openai.OpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0)
    image = oc.images.generate(prompt="a lighthouse", size="48x32", extra_body={"num_inference_steps": 2})
    assert _png(base64.b64decode(image.data[0].b64_json)).shape == (32, 48, 3)


def test_models_and_health(server, client: httpx.Client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["wan2.1-demo"]
    assert models["data"][0]["object"] == "model"
    details = client.get("/v1/models/wan2.1-demo").json()
    assert details["id"] == "wan2.1-demo"
    # A freshly saved folder: the DDPM-path keys diffusers writes into every UniPC config are quiet, not listed.
    assert details["accepted_config_keys"] == []
    assert "beta_schedule" in UNIPC_POLICY.quiet
    assert client.get("/v1/models/sora-2").status_code == 404
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["model"] == "wan2.1-demo"

    openai = pytest.importorskip("openai")
    oc = openai.OpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0)
    assert [m.id for m in oc.models.list()] == ["wan2.1-demo"]
