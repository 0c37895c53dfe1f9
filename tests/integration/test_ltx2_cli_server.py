"""LTX-2 through the CLI and the server: an mp4 with sound, --audio-out, --image, --two-stage, SSE stage names."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.servers import ThreadServer, parse_sse, wait_for_status
from vidloom import cli
from vidloom.media.audio import read_audio_stream, read_wav
from vidloom.media.video import read_video
from vidloom.serving.config import ServeConfig

SIZE = ["--height", "64", "--width", "64", "--frames", "9", "--fps", "25", "--steps", "2", "--seed", "1"]
# AAC at the rates the tiny vocoders make; a lossy codec: compare loudness, not samples.
AAC_RMS_TOLERANCE = 0.5


def _generate(ltx2_dir, out, *flags: str) -> None:
    code = cli.main(["generate", "--model", str(ltx2_dir), "--device", "cpu", "--prompt", "a robot dancing",
                     "--output", str(out), *SIZE, *flags])
    assert code == 0


def test_generate_writes_mp4_with_sound_and_wav(ltx2_dir, tmp_path):
    out, wav = tmp_path / "robot.mp4", tmp_path / "robot.wav"
    _generate(ltx2_dir, out, "--audio-out", str(wav))
    frames, fps = read_video(out)
    assert fps == 25
    assert frames.shape == (9, 64, 64, 3)
    track, pcm = read_audio_stream(out), read_wav(wav)
    assert track.samples.shape[0] == pcm.samples.shape[0] == 2
    duration = 9 / 25
    assert abs(pcm.samples.shape[1] / pcm.sample_rate - duration) <= 1 / pcm.sample_rate + 1e-9
    rms = lambda x: float(np.sqrt(np.mean(np.square(x))))  # noqa: E731
    assert rms(pcm.samples) > 1e-3
    assert abs(rms(track.samples) - rms(pcm.samples)) < AAC_RMS_TOLERANCE * rms(pcm.samples)


def test_generate_image_to_video_and_two_stage(ltx2_dir, tmp_path):
    image = tmp_path / "first.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(image)
    i2v = tmp_path / "i2v.mp4"
    _generate(ltx2_dir, i2v, "--image", str(image))
    assert read_video(i2v)[0].shape == (9, 64, 64, 3)
    hd = tmp_path / "hd.mp4"
    _generate(ltx2_dir, hd, "--two-stage")
    assert read_video(hd)[0].shape == (9, 128, 128, 3)  # the upsampler doubles the size
    assert read_audio_stream(hd).samples.shape[0] == 2


@pytest.fixture(scope="module")
def server(ltx2_dir, tmp_path_factory):
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    engine = VideoGenerator.from_pretrained(ltx2_dir, device="cpu", deploy=DeployConfig(two_stage=True)).engine
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("ltx2-data"), queue_size=4, graceful_shutdown_s=2)
    with ThreadServer(engine, config) as running:
        yield running


def test_video_job_completes_with_sound_and_staged_progress(server, tmp_path):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        job = client.post("/v1/videos", json={"prompt": "a robot dancing", "size": "64x64", "num_frames": 9,
                                               "fps": 25, "num_inference_steps": 2, "seed": 2}).json()
        with client.stream("GET", f"/v1/videos/{job['id']}/events") as response:
            events = parse_sse(list(response.iter_lines()))
        assert wait_for_status(client, job["id"], {"completed"})["status"] == "completed"
        content = client.get(f"/v1/videos/{job['id']}/content")
    assert content.status_code == 200
    phases = [d["phase"] for name, d in events if name == "progress" and d.get("phase")]
    assert list(dict.fromkeys(phases)) == ["stage1", "upsample", "stage2", "decode", "audio"]
    path = tmp_path / "job.mp4"
    path.write_bytes(content.content)
    assert read_video(path)[0].shape == (9, 128, 128, 3)
    assert read_audio_stream(path).samples.shape[0] == 2
