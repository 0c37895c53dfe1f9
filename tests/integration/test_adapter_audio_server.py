"""An adapted audio pipeline (AudioLDM, no native recipe) served by `POST /v1/audio/generations`, as clients use it.

The server is the real CLI in this process (tests.helpers.three_paths.CliServer) on a tiny random AudioLDM folder;
the request's `seconds` reaches the pipeline as `audio_length_in_s`. Outputs are compared with the pipeline called
directly (same seed, CPU generator): the WAV's 16-bit samples equal the reference waveform's, the job's waveform
equals it exactly.
"""

from __future__ import annotations

import base64
import io
import wave

import httpx
import numpy as np
import pytest

from tests.helpers.adapter_checkpoints import reference_output, write_tiny_pipeline
from tests.helpers.servers import parse_sse, wait_for_status
from tests.helpers.three_paths import CliServer, run_cli
from vidloom.media.audio import to_pcm16

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")
PROMPT = "a dog barks in the rain"
# The tiny AudioLDM's window: UNet sample_size 8 x VAE 2x x 64 vocoder samples per mel frame at 16 kHz = 0.064 s;
# requests may ask up to 4 windows (MAX_WINDOWS), in whole mel frames of 4 ms at least.
SECONDS = 0.1


@pytest.fixture(scope="module")
def audioldm(tmp_path_factory):
    folder = write_tiny_pipeline(tmp_path_factory.mktemp("audioldm"), "audioldm")
    server = CliServer(["--model", str(folder)], tmp_path_factory.mktemp("audioldm-data"))
    assert server.url is not None, f"vidloom serve did not start on AudioLDM (exit {server.code})"
    yield folder, server
    server.stop()


def _wav(data: bytes) -> tuple[int, int, np.ndarray]:
    with wave.open(io.BytesIO(data)) as w:
        raw = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return w.getframerate(), w.getnchannels(), raw.reshape(-1, w.getnchannels()).T


def test_direct_answer_equals_the_pipeline_with_seconds_as_audio_length(audioldm):
    folder, server = audioldm
    body = {"prompt": PROMPT, "seconds": SECONDS, "num_inference_steps": 3, "seed": 9, "negative_prompt": "noise"}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        reply = http.post("/v1/audio/generations", json=body)
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        caps = http.get(f"/v1/models/{folder.name}").json()["capabilities"]
    assert (answer["sample_rate"], answer["seconds"], answer["seed"]) == (16000, SECONDS, 9)
    rate, channels, samples = _wav(base64.b64decode(answer["data"][0]["b64_json"]))
    expected = reference_output(folder, PROMPT, 9, num_inference_steps=3, negative_prompt="noise",
                                audio_length_in_s=SECONDS)
    assert (rate, channels, samples.shape[1]) == (16000, 1, 1600)
    assert np.array_equal(samples, to_pcm16(expected))
    assert caps["audio"] and caps["tasks"] == ["t2a"]
    assert caps["defaults"]["seconds"] == 0.064 and caps["defaults"]["max_seconds"] == 0.256


def test_background_job_streams_one_progress_event_per_step_and_cancels(audioldm):
    """A job queued behind a long one, watched from before its start: one progress event per pipeline step; the
    long one is cancelled mid-run (at its next step) when the stream opens."""
    folder, server = audioldm
    job_body = {"prompt": PROMPT, "seconds": SECONDS, "num_inference_steps": 3, "seed": 4, "background": True}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        blocker = http.post("/v1/audio/generations", json={**job_body, "num_inference_steps": 150}).json()  # max 200
        job = http.post("/v1/audio/generations", json=job_body).json()
        assert job["size"] == "0x0" and job["seconds"] == "0.1", job
        lines: list[str] = []
        with http.stream("GET", f"/v1/videos/{job['id']}/events") as response:
            for line in response.iter_lines():
                if not lines:
                    assert http.post(f"/v1/videos/{blocker['id']}/cancel").status_code == 200
                lines.append(line)
        events = parse_sse(lines)
        assert events[-1][0] == "completed", events
        steps = [(d["phase"], d["step"], d["total"]) for n, d in events if n == "progress" and d.get("phase")]
        assert steps == [("pipeline", 1, 3), ("pipeline", 2, 3), ("pipeline", 3, 3), ("decode", 1, 1)]
        cancelled = wait_for_status(http, blocker["id"], {"cancelled", "completed", "failed"})
        assert cancelled["status"] == "cancelled" and cancelled["progress"] < 100, cancelled
        assert http.get(f"/v1/videos/{blocker['id']}/content", params={"variant": "audio"}).status_code == 409
        content = http.get(f"/v1/videos/{job['id']}/content", params={"variant": "audio"})
        assert content.status_code == 200 and content.headers["content-type"] == "audio/wav"
    expected = reference_output(folder, PROMPT, 4, num_inference_steps=3, audio_length_in_s=SECONDS)
    assert np.array_equal(server.seen.written[job["id"]].audio, expected)
    assert np.array_equal(_wav(content.content)[2], to_pcm16(expected))
    assert blocker["id"] not in server.seen.written  # stopped before decoding


@pytest.mark.parametrize("fields, param", [
    ({"seconds": 0.3}, "seconds"),  # past 4 windows
    ({"seconds": 0.001}, "seconds"),  # shorter than one mel frame
    ({"seconds_start": 0.5}, "seconds_start"),  # AudioLDM's signature has no start
    ({"size": "64x64"}, "size"),
    ({"flow_shift": 3.0}, "flow_shift"),
    ({"num_inference_steps": 0}, "num_inference_steps"),
    ({"init_audio": "UklGRg=="}, "init_audio"),
    ({"output_format": "mp4"}, "output_format"),
])
def test_bad_fields_are_400_naming_them(audioldm, fields, param):
    _, server = audioldm
    with httpx.Client(base_url=server.url, timeout=30) as http:
        reply = http.post("/v1/audio/generations", json={"prompt": PROMPT, "num_inference_steps": 2, **fields})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_cli_seconds_writes_the_pipelines_waveform(audioldm, tmp_path, capsys):
    folder, _ = audioldm
    out = tmp_path / "dog.wav"
    outcome = run_cli(["--model", str(folder), "--prompt", PROMPT, "--seconds", "0.1", "--steps", "2",
                       "--seed", "5"], out, capsys)
    assert outcome.error is None, outcome.error
    expected = reference_output(folder, PROMPT, 5, num_inference_steps=2, audio_length_in_s=SECONDS)
    assert np.array_equal(outcome.output.audio, expected)
    assert np.array_equal(_wav(out.read_bytes())[2], to_pcm16(expected))
    refused = run_cli(["--model", str(folder), "--prompt", PROMPT, "--seconds-start", "0.02"], out, capsys)
    assert refused.error is not None and "--seconds-start" in refused.error, refused.error
