"""POST /v1/audio/generations on stable-audio-demo, as a client uses it: uvicorn on 127.0.0.1 and httpx."""

from __future__ import annotations

import base64
import io
import wave

import httpx
import numpy as np
import pytest

from tests.helpers.servers import ThreadServer, parse_sse
from vidloom.serving.config import ServeConfig

pytest.importorskip("torchsde")

SMALL = {"seconds": 0.25, "num_inference_steps": 2, "seed": 3}


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    from vidloom.generator import VideoGenerator

    return VideoGenerator.from_pretrained("stable-audio-demo", device="cpu",
                                          cache_dir=tmp_path_factory.mktemp("stable-audio-server-cache"))


@pytest.fixture(scope="module")
def server(generator, tmp_path_factory):
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("audio-data"), queue_size=8, graceful_shutdown_s=2)
    with ThreadServer(generator.engine, config) as running:
        yield running


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _wav(data: bytes) -> tuple[int, int, np.ndarray]:
    with wave.open(io.BytesIO(data)) as w:
        raw = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return w.getframerate(), w.getnchannels(), raw.reshape(-1, w.getnchannels()).T


def test_generation_answers_a_wav_equal_to_the_python_api(client, generator):
    reply = client.post("/v1/audio/generations", json={"prompt": "a dog barks", "negative_prompt": "hiss", **SMALL})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["output_format"] == "wav" and body["sample_rate"] == 16000 and body["seconds"] == 0.25
    assert body["seed"] == 3
    rate, channels, samples = _wav(base64.b64decode(body["data"][0]["b64_json"]))
    assert (rate, channels, samples.shape[1]) == (16000, 2, 4000)
    direct = generator.generate("a dog barks", negative_prompt="hiss", **SMALL)
    expected = np.round(np.clip(direct.audio, -1, 1) * 32767).astype(np.int16)
    assert np.array_equal(samples, expected)


def test_other_formats(client):
    reply = client.post("/v1/audio/generations", json={"prompt": "rain", "output_format": "flac", **SMALL})
    assert reply.status_code == 200, reply.text
    assert base64.b64decode(reply.json()["data"][0]["b64_json"])[:4] == b"fLaC"


@pytest.mark.parametrize("fields,param", [
    ({"seconds": 9.0}, "seconds"), ({"seconds_start": -2}, "seconds_start"), ({"output_format": "mp4"}, "output_format"),
    ({"response_format": "url"}, "response_format"), ({"seconds": True}, "seconds"), ({"size": "64x64"}, "size"),
    ({"num_inference_steps": 0}, "num_inference_steps"), ({"init_audio": [0.1, 0.2]}, "init_audio"),
])
def test_bad_fields_are_400_naming_them(client, fields, param):
    reply = client.post("/v1/audio/generations", json={"prompt": "rain", **fields})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_video_and_image_routes_refuse_an_audio_model(client):
    images = client.post("/v1/images/generations", json={"prompt": "rain"})
    assert images.status_code == 400 and images.json()["error"]["param"] == "model"
    videos = client.post("/v1/videos", json={"prompt": "rain"})
    assert videos.status_code == 400, videos.text
    assert "t2a" in videos.json()["error"]["message"]


def test_background_job_with_progress_events_and_audio_content(client):
    steps = 12  # long enough that the stream usually joins while it runs (a finished job sends only `completed`)
    reply = client.post("/v1/audio/generations",
                        json={"prompt": "rain", "background": True, **SMALL, "num_inference_steps": steps})
    assert reply.status_code == 200, reply.text
    job = reply.json()
    assert job["status"] in ("queued", "in_progress") and job["size"] == "0x0" and job["seconds"] == "0.25"
    with client.stream("GET", f"/v1/videos/{job['id']}/events") as stream:
        assert stream.status_code == 200
        events = parse_sse(list(stream.iter_lines()))
    assert events[-1][0] == "completed", events
    done = [d["step"] for n, d in events if n == "progress" and d.get("phase") == "denoise"]
    assert done == sorted(done) and (not done or done[-1] == steps), events
    record = client.get(f"/v1/videos/{job['id']}").json()
    assert record["status"] == "completed" and record["progress"] == 100
    content = client.get(f"/v1/videos/{job['id']}/content", params={"variant": "audio"})
    assert content.status_code == 200 and content.headers["content-type"] == "audio/wav"
    rate, channels, samples = _wav(content.content)
    assert (rate, channels, samples.shape[1]) == (16000, 2, 4000)
    as_video = client.get(f"/v1/videos/{job['id']}/content")
    assert as_video.status_code == 400 and as_video.json()["error"]["param"] == "variant"
    flac = client.post("/v1/audio/generations", json={"prompt": "rain", "background": True, "output_format": "flac"})
    assert flac.status_code == 400 and flac.json()["error"]["param"] == "output_format"
    assert client.delete(f"/v1/videos/{job['id']}").status_code == 200


def test_background_job_cancels_at_a_step(client):
    reply = client.post("/v1/audio/generations",
                        json={"prompt": "rain", "background": True, **SMALL, "num_inference_steps": 150})
    assert reply.status_code == 200, reply.text
    job = reply.json()
    assert client.post(f"/v1/videos/{job['id']}/cancel").status_code == 200
    with client.stream("GET", f"/v1/videos/{job['id']}/events") as stream:
        events = parse_sse(list(stream.iter_lines()))
    assert events[-1][0] == "cancelled"
    content = client.get(f"/v1/videos/{job['id']}/content", params={"variant": "audio"})
    assert content.status_code == 409


def test_model_details_describe_an_audio_model(client):
    caps = client.get("/v1/models/stable-audio-demo").json()["capabilities"]
    assert caps["audio"] and not caps["videos"] and not caps["images"] and caps["tasks"] == ["t2a"]
    assert caps["produces_audio"] and caps["inputs"] == []  # init_audio is not an HTTP field yet
    defaults = caps["defaults"]
    assert defaults["sample_rate"] == 16000 and defaults["seconds"] == defaults["max_seconds"] == 1.024
    assert "size" not in defaults and "num_frames" not in defaults
