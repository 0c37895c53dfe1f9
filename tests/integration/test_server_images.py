"""The Images API on a Flux2 Klein model, as clients use it: uvicorn on 127.0.0.1, httpx and the openai package."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.servers import ThreadServer
from vidloom.serving.config import ServeConfig

SMALL = {"size": "32x48", "num_inference_steps": 1, "seed": 3}


@pytest.fixture(scope="module")
def klein_engine(flux2_distilled_dir):
    from vidloom.generator import VideoGenerator

    return VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu").engine


@pytest.fixture(scope="module")
def klein_server(klein_engine, tmp_path_factory):
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("images-data"), queue_size=16, graceful_shutdown_s=2,
                         max_body_bytes=4 << 20)
    with ThreadServer(klein_engine, config) as running:
        yield running


@pytest.fixture
def client(klein_server):
    with httpx.Client(base_url=klein_server.url, timeout=60) as c:
        yield c


@pytest.fixture
def oc(klein_server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{klein_server.url}/v1", api_key="test", max_retries=0)


def _decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _png_bytes(w: int = 64, h: int = 64, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def test_openai_client_generates_n_images_as_b64_and_url(oc, client):
    result = oc.images.generate(prompt="a lighthouse", n=2, size="48x32",
                                extra_body={"num_inference_steps": 1, "seed": 5})
    images = [_decode(base64.b64decode(d.b64_json)) for d in result.data]
    assert [im.shape for im in images] == [(32, 48, 3)] * 2
    assert not np.array_equal(images[0], images[1])  # seeds 5 and 6

    by_url = oc.images.generate(prompt="a lighthouse", n=1, size="48x32", response_format="url",
                                extra_body={"num_inference_steps": 1, "seed": 5})
    fetched = httpx.get(by_url.data[0].url)
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/png"
    assert np.array_equal(_decode(fetched.content), images[0])  # same seed, same image


@pytest.mark.parametrize("fmt, magic", [("jpeg", b"\xff\xd8"), ("webp", b"RIFF")])
def test_output_formats(client, fmt, magic):
    response = client.post("/v1/images/generations", json={"prompt": "x", "output_format": fmt, **SMALL})
    assert response.status_code == 200, response.text
    assert base64.b64decode(response.json()["data"][0]["b64_json"]).startswith(magic)


def test_openai_client_edits_with_one_and_two_images(oc):
    one = oc.images.edit(image=("a.png", _png_bytes(), "image/png"), prompt="make it purple",
                         extra_body={"num_inference_steps": 1, "seed": 2})
    assert _decode(base64.b64decode(one.data[0].b64_json)).shape == (64, 64, 3)  # size from the image
    two = oc.images.edit(image=[("a.png", _png_bytes(), "image/png"), ("b.png", _png_bytes(80, 64, 1), "image/png")],
                         prompt="make it purple", n=2, size="48x32",
                         extra_body={"num_inference_steps": 1, "seed": 2})
    assert [_decode(base64.b64decode(d.b64_json)).shape for d in two.data] == [(32, 48, 3)] * 2
    first_only = oc.images.edit(image=[("a.png", _png_bytes(), "image/png")], prompt="make it purple", size="48x32",
                                extra_body={"num_inference_steps": 1, "seed": 2})
    # The list arrives as image[] parts: both images condition the result, not just the first.
    assert first_only.data[0].b64_json != two.data[0].b64_json


@pytest.mark.parametrize("field, value", [("n", 0), ("n", 11), ("response_format", "svg"),
                                          ("output_format", "gif"), ("size", "50x32")])
def test_bad_generation_fields_are_400_naming_them(client, field, value):
    response = client.post("/v1/images/generations", json={"prompt": "x", **SMALL, field: value})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == field


@pytest.mark.parametrize("upload, message", [
    (("notes.txt", b"hello, not an image", "text/plain"), "not a readable image"),
    (("tiny.png", _png_bytes(32, 32), "image/png"), "at least 64 px"),
])
def test_bad_edit_images_are_400_naming_image(client, upload, message):
    response = client.post("/v1/images/edits", data={"prompt": "x", "num_inference_steps": "1"},
                           files=[("image", upload)])
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "image" and message in error["message"]


def test_edit_without_image_or_with_mask_is_refused(client):
    no_image = client.post("/v1/images/edits", data={"prompt": "x"}, files=[("other", ("a.txt", b"x", "text/plain"))])
    assert no_image.status_code == 400 and no_image.json()["error"]["param"] == "other"
    missing = client.post("/v1/images/edits", files=[("prompt", (None, "x"))])  # multipart, no file part
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "image"
    masked = client.post("/v1/images/edits", data={"prompt": "x"},
                         files=[("image", ("a.png", _png_bytes(), "image/png")), ("mask", ("m.png", _png_bytes(), "image/png"))])
    assert masked.status_code == 400 and masked.json()["error"]["param"] == "mask"


def test_image_files_refuse_unknown_names(client):
    assert client.get("/v1/images/files/../../jobs.sqlite3").status_code == 404
    assert client.get("/v1/images/files/img_" + "0" * 32 + ".png").status_code == 404


def test_batch_policy_shares_the_steps_of_one_call(klein_engine, client, tmp_path):
    body = {"prompt": "a lighthouse", "n": 4, **SMALL, "num_inference_steps": 2}
    fifo = [base64.b64decode(d["b64_json"]) for d in client.post("/v1/images/generations", json=body).json()["data"]]
    config = ServeConfig(data_dir=tmp_path / "data", slots=4, policy="batch", graceful_shutdown_s=2)
    with ThreadServer(klein_engine, config) as batched:
        response = httpx.post(f"{batched.url}/v1/images/generations", json=body, timeout=60)
        assert response.status_code == 200, response.text
        stats = batched.app.state.jobs._engine.batch_stats
    assert stats["largest_batch"] == 4
    got = [base64.b64decode(d["b64_json"]) for d in response.json()["data"]]
    for a, b in zip(fifo, got):
        assert np.abs(_decode(a).astype(int) - _decode(b).astype(int)).max() <= 1  # see test_batching
