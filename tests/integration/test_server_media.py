"""POST /v1/videos with media: the OpenAI `input_reference` upload (image-to-video) and the `video` +
`strength` extension (video-to-video); every bad upload is a 400 naming the field, and the server keeps serving."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest

from tests.helpers.servers import SMALL, ThreadServer, wait_for_status
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.media.video import write_video
from vidloom.serving.config import ServeConfig

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks the Sora API deprecated
FORM = {"prompt": "a cat", **{k: str(v) for k, v in SMALL.items()}}


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    make_image(width, height, seed=3).save(buffer, format="PNG")
    return buffer.getvalue()


def _mp4(tmp_path, frames: int = 5) -> bytes:
    video = np.stack([np.asarray(make_image(48, 32, seed=i)) for i in range(frames)])
    return write_video(video, 8, tmp_path / "in.mp4").read_bytes()


def _error(response: httpx.Response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error["message"]


def test_t2v_model_refuses_an_image_and_accepts_a_video(client: httpx.Client, tmp_path):
    message = _error(client.post("/v1/videos", data=FORM, files={"input_reference": ("a.png", _png(48, 32))}),
                     "input_reference")
    assert "does not accept" in message
    response = client.post("/v1/videos", data={**FORM, "strength": "0.5"}, files={"video": ("in.mp4", _mp4(tmp_path))})
    assert response.status_code == 200, response.text
    video = wait_for_status(client, response.json()["id"], {"completed", "failed"})
    assert video["status"] == "completed", video
    assert video["parameters"]["video"] is True and video["parameters"]["strength"] == 0.5


@pytest.mark.parametrize(("files", "data", "param"), [
    ({"video": ("in.mp4", b"not a video at all")}, {}, "video"),
    ({"video": ("in.mp4", "MP4")}, {"strength": "1.5"}, "strength"),
    ({}, {"strength": "0.5"}, "strength"),  # strength without a video
    ({"input_reference": ("a.png", b"\x89PNG broken")}, {}, "input_reference"),
    ({"last_image": ("a.png", "PNG")}, {}, "last_image"),
])
def test_bad_uploads_are_400_naming_the_field(client: httpx.Client, tmp_path, files, data, param):
    files = {k: (name, _mp4(tmp_path) if body == "MP4" else _png(48, 32) if body == "PNG" else body)
             for k, (name, body) in files.items()}
    if files:
        response = client.post("/v1/videos", data={**FORM, **data}, files=files)
    else:
        response = client.post("/v1/videos", json={"prompt": "a cat", **SMALL, **{k: float(v) for k, v in data.items()}})
    _error(response, param)
    assert client.get("/health").status_code == 200


@pytest.fixture(scope="module")
def i2v_server(tmp_path_factory):
    from tests.helpers.wan_i2v_checkpoints import write_tiny_wan_i2v
    from vidloom.generator import VideoGenerator

    folder = write_tiny_wan_i2v(tmp_path_factory.mktemp("i2v-ckpt"))
    engine = VideoGenerator.from_pretrained(folder, device="cpu").engine
    with ThreadServer(engine, ServeConfig(data_dir=tmp_path_factory.mktemp("i2v-data"), graceful_shutdown_s=2)) as s:
        yield s


def test_i2v_model_takes_input_reference_from_the_openai_client(i2v_server):
    openai = pytest.importorskip("openai")
    oc = openai.OpenAI(base_url=f"{i2v_server.url}/v1", api_key="test", max_retries=0)
    # An image of another size than the video: resized as diffusers does.
    video = oc.videos.create(prompt="a cat", size="48x32", input_reference=("first.png", _png(60, 41), "image/png"),
                             extra_body={"num_frames": 5, "num_inference_steps": 2})
    with httpx.Client(base_url=i2v_server.url, timeout=30) as client:
        done = wait_for_status(client, video.id, {"completed", "failed"})
        assert done["status"] == "completed", done
        assert done["parameters"]["image"] is True and done["parameters"]["task"] == "i2v"
        # Without the image the request is refused, naming the API field.
        _error(client.post("/v1/videos", json={"prompt": "a cat", **SMALL}), "input_reference")
        _error(client.post("/v1/videos", data=FORM, files={"input_reference": ("a.txt", b"hello")}), "input_reference")
