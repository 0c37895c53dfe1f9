"""POST /v1/audio/generations on stable-audio-demo, as a client uses it: uvicorn on 127.0.0.1 and httpx."""

from __future__ import annotations

import base64
import io
import wave

import httpx
import numpy as np
import pytest

from tests.helpers.servers import ThreadServer, parse_sse
from tests.helpers.wav import pcm16_wav
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
    # clips the window cannot hold: no sample at 16 kHz, a start at the window's end, one the window would cut short
    ({"seconds": 0.00005}, "seconds"), ({"seconds_start": 1.024, "seconds": 0.5}, "seconds"),
    ({"seconds_start": 1.0, "seconds": 0.5}, "seconds"), ({"flow_shift": 3.0}, "flow_shift"),
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
    assert caps["produces_audio"] and caps["inputs"] == ["init_audio", "seconds", "seconds_start"]  # a file part, the length options
    defaults = caps["defaults"]
    assert defaults["sample_rate"] == 16000 and defaults["seconds"] == defaults["max_seconds"] == 1.024
    assert "size" not in defaults and "num_frames" not in defaults


def _wav_file(samples: np.ndarray, rate: int) -> bytes:
    return pcm16_wav(np.round(np.clip(samples, -1, 1) * 32767).astype("<i2").T, rate)


INIT = (np.random.default_rng(1).standard_normal((2, 6000)) * 0.3).astype(np.float32)


def test_init_audio_upload_equals_the_python_api_with_the_same_file(client, generator, tmp_path):
    """A multipart file part, as images/edits and videos take uploads: the WAV the Python API reads from a path."""
    data = _wav_file(INIT, 16000)
    (tmp_path / "init.wav").write_bytes(data)
    form = {"prompt": "a dog barks", "seconds": "0.5", "num_inference_steps": "3", "seed": "5"}
    reply = client.post("/v1/audio/generations", data=form, files={"init_audio": ("init.wav", data, "audio/wav")})
    assert reply.status_code == 200, reply.text
    _, _, samples = _wav(base64.b64decode(reply.json()["data"][0]["b64_json"]))
    direct = generator.generate("a dog barks", seconds=0.5, num_inference_steps=3, seed=5,
                                init_audio=tmp_path / "init.wav")
    without = generator.generate("a dog barks", seconds=0.5, num_inference_steps=3, seed=5)
    assert np.array_equal(samples, np.round(np.clip(direct.audio, -1, 1) * 32767).astype(np.int16))
    assert not np.array_equal(direct.audio, without.audio)  # the upload reached the sampler
    # Another container, decoded by FFmpeg, as a background job: equal to the Python API reading that file.
    from tests.helpers.servers import wait_for_status
    from vidloom.media.audio import AudioTrack
    from vidloom.media.audio_files import write_audio_only

    flac = write_audio_only(AudioTrack(INIT, 16000), tmp_path / "init.flac")
    job = client.post("/v1/audio/generations", data={**form, "background": "true"},
                      files={"init_audio": ("init.flac", flac.read_bytes(), "audio/flac")})
    assert job.status_code == 200, job.text
    assert wait_for_status(client, job.json()["id"], {"completed", "failed"})["status"] == "completed"
    content = client.get(f"/v1/videos/{job.json()['id']}/content", params={"variant": "audio"})
    direct = generator.generate("a dog barks", seconds=0.5, num_inference_steps=3, seed=5, init_audio=flac)
    assert np.array_equal(_wav(content.content)[2], np.round(np.clip(direct.audio, -1, 1) * 32767).astype(np.int16))


@pytest.mark.parametrize("upload, why", [
    (_wav_file(INIT, 8000), "8000 Hz"),  # another rate: resample first
    (_wav_file(np.zeros((2, 17000), np.float32), 16000), "max_init_audio_seconds"),  # past the 1.024 s window
    (b"RIFF\x00\x00not audio at all", "not a readable audio file"),
    (b"", "empty"),
])
def test_bad_init_audio_uploads_are_400_naming_init_audio(client, upload, why):
    reply = client.post("/v1/audio/generations", data={"prompt": "rain", "seconds": "0.25"},
                        files={"init_audio": ("in.wav", upload, "audio/wav")})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "init_audio" and why in error["message"], error
