"""Diffusers pipelines without a native recipe, served by `vidloom serve` through the adapter, as clients use them.

Each server runs the real CLI in this process (tests.helpers.three_paths.CliServer) on a tiny random folder;
outputs are compared with the pipeline called directly (same seed, CPU generator): bit-exact uint8 frames (the job's
VideoOutput before mp4 encoding; the PNG the Images API returns) and the same waveform.
"""

from __future__ import annotations

import base64
import io
import re
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.adapter_checkpoints import reference_output, write_tiny_pipeline
from tests.helpers.servers import parse_sse, wait_for_status
from tests.helpers.three_paths import CliServer

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")
openai = pytest.importorskip("openai")
PROMPT = "a dog barks in the rain"


def _serve(kind: str, tmp_path_factory: pytest.TempPathFactory):
    folder = write_tiny_pipeline(tmp_path_factory.mktemp(kind), kind)
    server = CliServer(["--model", str(folder)], tmp_path_factory.mktemp(f"{kind}-data"))
    assert server.url is not None, f"vidloom serve did not start on {kind} (exit {server.code})"
    return folder, server


@pytest.fixture(scope="module")
def cogvideox(tmp_path_factory):
    folder, server = _serve("cogvideox", tmp_path_factory)
    yield folder, server
    server.stop()


def _client(server: CliServer):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0)


def _video_job(server: CliServer, body: dict, extra: dict) -> tuple[str, dict]:
    video = _client(server).videos.create(**body, extra_body=extra)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        return video.id, wait_for_status(http, video.id, {"completed", "failed", "cancelled"})


def test_cogvideox_video_equals_the_pipeline_and_streams_one_progress_event_per_step(cogvideox):
    folder, server = cogvideox
    extra = {"num_frames": 5, "num_inference_steps": 3, "seed": 11, "negative_prompt": "blurry", "guidance_scale": 5.0}
    video_id, job = _video_job(server, {"prompt": PROMPT, "size": "16x16"}, extra)
    assert job["status"] == "completed", job
    expected = reference_output(folder, PROMPT, 11, height=16, width=16, num_frames=5, num_inference_steps=3,
                                negative_prompt="blurry", guidance_scale=5.0)
    written = server.seen.written[video_id]
    assert written.frames.shape == expected.shape and np.array_equal(written.frames, expected)

    content = _client(server).videos.download_content(video_id).read()
    assert content[4:8] == b"ftyp"  # the mp4 a client downloads
    with httpx.Client(base_url=server.url, timeout=30) as http:
        with http.stream("GET", f"/v1/videos/{video_id}/events") as response:
            events = parse_sse(list(response.iter_lines()))
    assert [name for name, _ in events] == ["completed"]  # a late subscriber: the final state at once

    # A fresh job queued behind a long one, watched from before its start: one progress event per pipeline step.
    client = _client(server)
    blocker = client.videos.create(prompt=PROMPT, size="16x16", extra_body={**extra, "num_inference_steps": 400})
    job = client.videos.create(prompt=PROMPT, size="16x16", extra_body={**extra, "seed": 12})
    lines: list[str] = []
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("GET", f"/v1/videos/{job.id}/events") as response:
            for line in response.iter_lines():
                if not lines:
                    http.post(f"/v1/videos/{blocker.id}/cancel")
                lines.append(line)
    events = parse_sse(lines)
    assert events[-1][0] == "completed"
    steps = [(d["phase"], d["step"], d["total"]) for n, d in events if n == "progress" and d.get("phase")]
    assert steps == [("pipeline", 1, 3), ("pipeline", 2, 3), ("pipeline", 3, 3), ("decode", 1, 1)]
    with httpx.Client(base_url=server.url, timeout=30) as http:  # the same metrics as native families
        metrics = http.get("/metrics").text
    assert re.search(r'vidloom_step_seconds_count\{phase="pipeline"\} ([0-9.]+)', metrics)
    assert float(re.search(r'vidloom_requests_total\{kind="video",status="completed"\} ([0-9.]+)', metrics)[1]) >= 2


def test_cancel_mid_run_stops_the_pipeline_at_the_next_step(cogvideox):
    _, server = cogvideox
    client = _client(server)
    video = client.videos.create(prompt=PROMPT, size="16x16",
                                 extra_body={"num_frames": 5, "num_inference_steps": 400, "seed": 1})
    with httpx.Client(base_url=server.url, timeout=30) as http:
        deadline = time.monotonic() + 60
        while (body := http.get(f"/v1/videos/{video.id}").json())["progress"] < 1:
            assert body["status"] in ("queued", "in_progress") and time.monotonic() < deadline, body
            time.sleep(0.02)
        cancelled = http.post(f"/v1/videos/{video.id}/cancel").json()
        assert cancelled["status"] == "cancelled" and cancelled["progress"] < 100
        # The slot is free again: the next job runs to completion.
        _, after = _video_job(server, {"prompt": PROMPT, "size": "16x16"},
                              {"num_frames": 5, "num_inference_steps": 2, "seed": 2})
        assert after["status"] == "completed", after
    assert video.id not in server.seen.written  # stopped before decoding: no output was written
    import threading

    assert not [t for t in threading.enumerate() if t.name == "vidloom-diffusers-pipeline"]  # no call left behind


@pytest.mark.parametrize("field, value, param", [
    ("flow_shift", 5.0, "flow_shift"), ("sampler", "unipc", "sampler"), ("step_cache_threshold", 0.1,
                                                                        "step_cache_threshold"),
    ("size", "18x16", "size"),
    ("num_inference_steps", 5000, "num_inference_steps"),  # over the server's max_steps (20x the card's 50)
    ("prompt", "a dog " * 700, "prompt"),  # past 16 characters per token of the pipeline's max_sequence_length
])
def test_fields_the_pipeline_does_not_take_are_400_naming_them(cogvideox, field, value, param):
    _, server = cogvideox
    body = {"prompt": PROMPT, "size": "16x16", "num_frames": 5, "num_inference_steps": 2, field: value}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        response = http.post("/v1/videos", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_mochi_video_equals_the_pipeline(tmp_path_factory):
    folder, server = _serve("mochi", tmp_path_factory)
    try:
        video_id, job = _video_job(server, {"prompt": PROMPT, "size": "16x16"},
                                   {"num_frames": 7, "num_inference_steps": 2, "seed": 5})
        assert job["status"] == "completed", job
        expected = reference_output(folder, PROMPT, 5, height=16, width=16, num_frames=7, num_inference_steps=2)
        assert np.array_equal(server.seen.written[video_id].frames, expected)
    finally:
        server.stop()


def test_qwen_image_png_equals_the_pipeline(tmp_path_factory):
    # Served by the native qwen_image family since #38 (no longer the adapter): still the pipeline's exact PNGs.
    folder, server = _serve("qwen-image", tmp_path_factory)
    try:
        client = _client(server)
        for extra, direct in (({}, {}), ({"negative_prompt": "dark", "guidance_scale": 3.0},
                                          {"negative_prompt": "dark", "true_cfg_scale": 3.0})):
            result = client.images.generate(prompt=PROMPT, size="32x32",
                                            extra_body={"num_inference_steps": 2, "seed": 4, **extra})
            got = np.asarray(Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).convert("RGB"))
            expected = reference_output(folder, PROMPT, 4, height=32, width=32, num_inference_steps=2, **direct)
            assert np.array_equal(got, expected[0]), extra
        with httpx.Client(base_url=server.url, timeout=30) as http:
            response = http.post("/v1/images/generations", json={"prompt": PROMPT, "size": "32x32", "flow_shift": 2.0})
        assert response.status_code == 400 and response.json()["error"]["param"] == "flow_shift"
    finally:
        server.stop()


def test_audioldm_serves_no_video_and_its_waveform_equals_the_pipeline(tmp_path_factory):
    from vidloom.generator import VideoGenerator

    folder, server = _serve("audioldm", tmp_path_factory)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            response = http.post("/v1/videos", json={"prompt": PROMPT, "num_inference_steps": 2})
            assert response.status_code == 400 and response.json()["error"]["param"] == "task"
            assert "t2a" in response.json()["error"]["message"]
    finally:
        server.stop()
    gen = VideoGenerator.from_pretrained(folder, device="cpu")
    events: list = []
    out = gen.generate(PROMPT, num_inference_steps=3, seed=9, negative_prompt="noise", on_event=events.append)
    expected = reference_output(folder, PROMPT, 9, num_inference_steps=3, negative_prompt="noise")
    assert out.frames.shape[0] == 0 and out.sample_rate == 16000
    assert np.array_equal(out.audio, expected)
    steps = [(e.step, e.total) for e in events if getattr(e, "phase", None) == "pipeline"]
    assert steps == [(1, 3), (2, 3), (3, 3)]


def test_attention_backend_goes_to_diffusers_dispatcher_and_a_missing_kernel_fails_the_load(tmp_path):
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.errors import DeployError
    from vidloom.generator import VideoGenerator

    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed: the backend would load")
    folder = write_tiny_pipeline(tmp_path / "cog", "cogvideox")
    with pytest.raises(DeployError, match=r"attention_backend \(--attention-backend\) 'flash': diffusers refused it"):
        VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(attention_backend="flash"))


def test_interleaved_requests_on_one_pipeline_keep_their_own_state(cogvideox, tmp_path):
    """Two slots stepped round-robin: each request steps its own pipeline view (scheduler, call state), so both
    equal their direct calls although their steps alternate on shared modules."""
    folder, _ = cogvideox
    server = CliServer(["--model", str(folder), "--slots", "2", "--policy", "interleave"], tmp_path / "data")
    try:
        client = _client(server)
        jobs = [client.videos.create(prompt=prompt, size="16x16", extra_body={"num_frames": 5, "seed": seed,
                                                                             "num_inference_steps": steps})
                for prompt, seed, steps in ((PROMPT, 21, 4), ("a cat on a roof", 22, 6))]
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for job in jobs:
                assert wait_for_status(http, job.id, {"completed", "failed"})["status"] == "completed"
        for job, (prompt, seed, steps) in zip(jobs, ((PROMPT, 21, 4), ("a cat on a roof", 22, 6))):
            expected = reference_output(folder, prompt, seed, height=16, width=16, num_frames=5,
                                        num_inference_steps=steps)
            assert np.array_equal(server.seen.written[job.id].frames, expected), prompt
    finally:
        server.stop()


def test_cogvideox_image_to_video_takes_the_uploaded_first_frame(tmp_path_factory):
    folder, server = _serve("cogvideox-i2v", tmp_path_factory)
    try:
        rng = np.random.default_rng(0)
        image = Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
        png = io.BytesIO()
        image.save(png, "PNG")
        extra = {"num_frames": 5, "num_inference_steps": 2, "seed": 8}
        video_id, job = _video_job(server, {"prompt": PROMPT, "size": "16x16",
                                            "input_reference": ("first.png", png.getvalue(), "image/png")}, extra)
        assert job["status"] == "completed", job
        expected = reference_output(folder, PROMPT, 8, image=image, height=16, width=16, num_frames=5,
                                    num_inference_steps=2)
        assert np.array_equal(server.seen.written[video_id].frames, expected)
        with httpx.Client(base_url=server.url, timeout=30) as http:  # the pipeline cannot run without its image
            response = http.post("/v1/videos", json={"prompt": PROMPT, "size": "16x16", **extra})
        assert response.status_code == 400 and response.json()["error"]["param"] == "input_reference"
    finally:
        server.stop()


def test_offload_text_encoder_sends_it_back_after_encoding_and_changes_no_output(cogvideox):
    """accelerate's hook keeps the encoder in host memory; the loop offloads it at the request's first step
    boundary (after it encoded, before the first denoise step reports). On CPU the bytes cannot differ."""
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    folder, _ = cogvideox
    gen = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(offload_text_encoder=True))
    encoder = gen.engine.instance["pipeline"].text_encoder
    assert hasattr(encoder, "_hf_hook")
    log: list[str] = []
    encoder.register_forward_hook(lambda *_: log.append("encode"))
    for hook in gen.engine.instance["text_encoder_hooks"]:
        real = hook.offload
        hook.offload = lambda real=real: (log.append("offload"), real())
    out = gen.generate(PROMPT, height=16, width=16, num_frames=5, num_inference_steps=2, seed=3,
                       on_event=lambda e: log.append(getattr(e, "phase", "event")))
    assert log.index("encode") < log.index("offload") < log.index("pipeline") and log.count("offload") == 1
    expected = reference_output(folder, PROMPT, 3, height=16, width=16, num_frames=5, num_inference_steps=2)
    assert np.array_equal(out.frames, expected)
