"""Equivalence rule for the unified-model request fields (`reason`, `sound`) on a tiny Cosmos3 folder:
`vidloom generate --reason`, `generate(..., reason=True)` and the server's `reason` JSON field give the
same resolved request, the same written prompt and the same frames; `sound` on a checkpoint without an
audio tokenizer is refused on every path, naming the field."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.three_paths import CliServer, Outcome, assert_same_outcome, run_cli
from vidloom.generator import VideoGenerator

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BASE = {"prompt": "a red fox in the snow", "height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2,
        "seed": 3}
BASE_CLI = ["--prompt", BASE["prompt"], "--height", "32", "--width", "32", "--frames", "5", "--steps", "2",
            "--seed", "3"]


@pytest.fixture(scope="module")
def served(cosmos3_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    running = CliServer(["--model", str(cosmos3_dir)], tmp_path_factory.mktemp("cosmos3-serve"))
    assert running.url is not None, f"vidloom serve exited with {running.code}"
    yield running
    running.stop()


def _api(folder: Path, **kwargs) -> Outcome:
    with VideoGenerator.from_pretrained(folder, device="cpu") as gen:
        return Outcome(gen.engine.instance.deploy, gen.generate(**kwargs))


def test_reason_is_the_same_on_every_path(cosmos3_dir: Path, served: CliServer, tmp_path: Path, capsys):
    api = _api(cosmos3_dir, **BASE, reason=True)
    cli = run_cli(["--model", str(cosmos3_dir), *BASE_CLI, "--reason"], tmp_path / "cli.mp4", capsys)
    http = served.run({"prompt": BASE["prompt"], "size": "32x32"},
                      {"num_frames": 5, "num_inference_steps": 2, "seed": 3, "reason": True})
    written = api.output.metadata["reasoned_prompt"]
    assert written and written != BASE["prompt"]
    for outcome in (cli, http):
        assert outcome.output.metadata["reasoned_prompt"] == written
    assert_same_outcome(api, cli, "reason: CLI vs Python API")
    assert_same_outcome(api, http, "reason: HTTP vs Python API")
    assert http.parameters["reason"] is True
    plain = _api(cosmos3_dir, **BASE)
    assert "reasoned_prompt" not in plain.output.metadata
    assert (plain.output.frames != api.output.frames).any()


def test_reasoning_streams_over_sse(served: CliServer):
    """The job's SSE stream carries the reasoning text as it is decoded, before the denoise progress."""
    import json

    body = {"prompt": BASE["prompt"], "size": "32x32", "num_frames": 5, "num_inference_steps": 2, "seed": 3,
            "reason": True}
    with httpx.Client(base_url=served.url, timeout=60) as http:
        job = http.post("/v1/videos", json=body).json()
        events: list[tuple[str, dict]] = []
        with http.stream("GET", f"/v1/videos/{job['id']}/events") as stream:
            name = None
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    name = line[len("event: "):]
                elif line.startswith("data: "):
                    events.append((name, json.loads(line[len("data: "):])))
    names = [n for n, _ in events]
    assert names[-1] == "completed"
    text = "".join(d["text"] for n, d in events if n == "reasoning")
    assert all(d["text"] for n, d in events if n == "reasoning"), "a reasoning update with no text was streamed"
    assert text.strip() == events[-1][1]["metadata"]["reasoned_prompt"]
    denoise = [i for i, (n, d) in enumerate(events) if n == "progress" and d.get("phase") == "denoise"]
    assert denoise and max(i for i, n in enumerate(names) if n == "reasoning") < min(denoise)


def test_sound_without_an_audio_tokenizer_is_refused_on_every_path(cosmos3_dir: Path, served: CliServer,
                                                                   tmp_path: Path, capsys):
    from vidloom.core.errors import InvalidRequest

    with VideoGenerator.from_pretrained(cosmos3_dir, device="cpu") as gen:
        with pytest.raises(InvalidRequest) as exc:
            gen.generate(**BASE, sound=True)
    assert exc.value.field == "sound"
    cli = run_cli(["--model", str(cosmos3_dir), *BASE_CLI, "--sound"], tmp_path / "cli.mp4", capsys)
    assert cli.error is not None and "sound" in cli.error
    response = httpx.post(f"{served.url}/v1/videos", json={"prompt": BASE["prompt"], "size": "32x32", "sound": True})
    assert response.status_code == 400 and "sound" in response.text


def test_images_api_runs_the_image_path(cosmos3_dir: Path, served: CliServer):
    """/v1/images/generations on the unified model is the one-frame image path (image templates), as in Python."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    body = {"prompt": BASE["prompt"], "size": "32x32", "seed": 3, "num_inference_steps": 2}
    response = httpx.post(f"{served.url}/v1/images/generations", json=body, timeout=60)
    assert response.status_code == 200, response.text
    served_png = Image.open(io.BytesIO(base64.b64decode(response.json()["data"][0]["b64_json"])))
    api = _api(cosmos3_dir, prompt=BASE["prompt"], height=32, width=32, num_frames=1, num_inference_steps=2, seed=3)
    assert np.array_equal(np.asarray(served_png.convert("RGB")), api.output.frames[0])


def test_one_loaded_instance_answers_videos_images_and_chat(served: CliServer):
    """One `vidloom serve` of a Cosmos3 folder: /v1/chat/completions (the reasoner, greedy) while a video job
    of the same model runs to completion, then an image, all on the one resident copy of the weights."""
    with httpx.Client(base_url=served.url, timeout=60) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        job = http.post("/v1/videos", json={"prompt": BASE["prompt"], "size": "32x32", "num_frames": 5,
                                            "num_inference_steps": 2, "seed": 3}).json()
        chat = http.post("/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": "describe a fox"}],
            "max_tokens": 8, "temperature": 0})
        assert chat.status_code == 200, chat.text
        answer = chat.json()
        assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] >= 1
        assert answer["choices"][0]["finish_reason"] in ("stop", "length")
        deadline = time.monotonic() + 120
        while (state := http.get(f"/v1/videos/{job['id']}").json())["status"] in ("queued", "in_progress"):
            assert time.monotonic() < deadline, state
            time.sleep(0.1)
        assert state["status"] == "completed", state
        image = http.post("/v1/images/generations", json={"prompt": BASE["prompt"], "size": "32x32",
                                                          "num_inference_steps": 2})
        assert image.status_code == 200, image.text


def test_sound_is_the_same_on_every_path(tmp_path: Path, capsys):
    """On a checkpoint with an audio tokenizer: `--sound --audio-out`, `generate(sound=True)` and the server's
    `sound` field give the same frames and waveform; the CLI's and the job's mp4 carry the AAC track."""
    from tests.helpers.cosmos3_sound_checkpoints import write_tiny_cosmos3_sound
    from vidloom.media.audio import read_audio_stream, read_wav

    folder = write_tiny_cosmos3_sound(tmp_path / "tiny-cosmos3-sound")
    api = _api(folder, **BASE, sound=True)
    wav = tmp_path / "cli.wav"
    cli = run_cli(["--model", str(folder), *BASE_CLI, "--sound", "--audio-out", str(wav)], tmp_path / "cli.mp4",
                  capsys)
    server = CliServer(["--model", str(folder)], tmp_path / "serve-data")
    try:
        assert server.url is not None, f"vidloom serve exited with {server.code}"
        http = server.run({"prompt": BASE["prompt"], "size": "32x32"},
                          {"num_frames": 5, "num_inference_steps": 2, "seed": 3, "sound": True})
        [job] = server.seen.written
        stored = tmp_path / "served.mp4"
        stored.write_bytes(httpx.get(f"{server.url}/v1/videos/{job}/content", timeout=30).content)
    finally:
        server.stop()
    assert api.output.audio is not None and api.output.sample_rate == 8000 and api.output.audio.std() > 1e-3
    assert_same_outcome(api, cli, "sound: CLI vs Python API")
    assert_same_outcome(api, http, "sound: HTTP vs Python API")
    assert read_wav(wav).sample_rate == 8000
    plain_cli = run_cli(["--model", str(folder), *BASE_CLI, "--sound"], tmp_path / "next.mp4", capsys)
    assert plain_cli.error is None and read_wav(tmp_path / "next.wav").sample_rate == 8000  # the wav next to it
    for mp4 in (tmp_path / "cli.mp4", stored):
        assert read_audio_stream(mp4).sample_rate == 8000, mp4
