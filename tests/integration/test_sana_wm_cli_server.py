"""SANA-WM through the CLI and the server: --camera / --c2w / --intrinsics, and the camera fields of /v1/videos."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.sana_wm_checkpoints import CONFIGS, write_tiny_sana_wm
from tests.helpers.servers import ThreadServer, parse_sse, wait_for_status
from vidloom import cli
from vidloom.media.video import read_video
from vidloom.serving.config import ServeConfig

SIZE = ["--height", "64", "--width", "96", "--frames", "17", "--steps", "2", "--seed", "1", "--guidance", "1"]


@pytest.fixture(scope="module")
def sana_dir(tmp_path_factory):
    return write_tiny_sana_wm(tmp_path_factory.mktemp("sana-wm-cli"), CONFIGS[0])


@pytest.fixture(scope="module")
def first_frame(tmp_path_factory):
    path = tmp_path_factory.mktemp("sana-img") / "first.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 80, 3), dtype=np.uint8)).save(path)
    return path


def _generate(sana_dir, first_frame, out, *flags: str) -> int:
    return cli.main(["generate", "--model", str(sana_dir), "--device", "cpu", "--prompt", "a car driving",
                     "--image", str(first_frame), "--output", str(out), *SIZE, *flags])


def test_cli_action_string_and_c2w_file(sana_dir, first_frame, tmp_path):
    action = tmp_path / "action.mp4"
    assert _generate(sana_dir, first_frame, action, "--camera", "w-8,jw-8", "--intrinsics", "60,60,40,24") == 0
    assert read_video(action)[0].shape == (17, 64, 96, 3)
    poses = tmp_path / "poses.npy"
    np.save(poses, np.tile(np.eye(4, dtype=np.float32), (9, 1, 1)))  # 9 poses: a 9-frame video
    k = tmp_path / "k.json"
    k.write_text(json.dumps([[60, 0, 40], [0, 60, 24], [0, 0, 1]]))
    still = tmp_path / "still.mp4"
    assert _generate(sana_dir, first_frame, still, "--c2w", str(poses), "--intrinsics", str(k)) == 0
    assert read_video(still)[0].shape == (9, 64, 96, 3)


@pytest.mark.parametrize("flags, flag", [
    (["--camera", "w-8,x-2", "--intrinsics", "60,60,40,24"], "--camera"),
    (["--camera", "w-8"], "--intrinsics"),
    (["--camera", "w-8", "--intrinsics", "60,sixty"], "--intrinsics"),
    (["--c2w", "/no/such/poses.npy", "--intrinsics", "60,60,40,24"], "--c2w"),
])
def test_cli_bad_camera_flags_name_the_flag(sana_dir, first_frame, tmp_path, capsys, flags, flag):
    assert _generate(sana_dir, first_frame, tmp_path / "x.mp4", *flags) != 0
    assert f"error: {flag}:" in capsys.readouterr().err


@pytest.fixture(scope="module")
def server(sana_dir, tmp_path_factory):
    from vidloom.generator import VideoGenerator

    engine = VideoGenerator.from_pretrained(sana_dir, device="cpu").engine
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("sana-data"), queue_size=4, graceful_shutdown_s=2)
    with ThreadServer(engine, config) as running:
        yield running


def _form(first_frame, **fields: str):
    data = {"prompt": "a car driving", "size": "96x64", "num_frames": "17", "num_inference_steps": "2",
            "guidance_scale": "1", "seed": "2", **fields}
    return dict(data=data, files={"input_reference": ("first.png", first_frame.read_bytes(), "image/png")})


def test_video_job_with_a_camera_completes(server, first_frame, tmp_path):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        job = client.post("/v1/videos", **_form(first_frame, camera="w-8,jw-8", intrinsics="[60, 60, 40, 24]"))
        assert job.status_code == 200, job.text
        video_id = job.json()["id"]
        with client.stream("GET", f"/v1/videos/{video_id}/events") as response:
            events = parse_sse(list(response.iter_lines()))
        assert wait_for_status(client, video_id, {"completed"})["status"] == "completed"
        content = client.get(f"/v1/videos/{video_id}/content")
    assert [d["phase"] for name, d in events if name == "progress" and d.get("phase")][0] == "stage1"
    path = tmp_path / "job.mp4"
    path.write_bytes(content.content)
    assert read_video(path)[0].shape == (17, 64, 96, 3)


@pytest.mark.parametrize("fields, field", [
    (dict(camera="w-8,,a-2", intrinsics="[60, 60, 40, 24]"), "camera"),
    (dict(camera="w-8", c2w="[[1, 0], [0, 1]]", intrinsics="[60, 60, 40, 24]"), "camera"),
    (dict(c2w="[[1, 0], [0, 1]]", intrinsics="[60, 60, 40, 24]"), "c2w"),
    (dict(camera="w-8", intrinsics="not json"), "intrinsics"),
    (dict(camera="w-8"), "intrinsics"),
    (dict(camera="w-\u00b2", intrinsics="[60, 60, 40, 24]"), "camera"),
    (dict(camera="w-" + "9" * 5000, intrinsics="[60, 60, 40, 24]"), "camera"),
    (dict(camera="w-99999", intrinsics="[60, 60, 40, 24]"), "camera"),
    (dict(c2w="[" * 10000 + "]" * 10000, intrinsics="[60, 60, 40, 24]"), "c2w"),
    (dict(c2w=f"[[[1{'0' * 400}, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]]", intrinsics="[60, 60, 40, 24]"),
     "c2w"),
    (dict(c2w=json.dumps(np.zeros((9, 4, 4)).tolist()), intrinsics="[60, 60, 40, 24]"), "c2w"),
    (dict(c2w=json.dumps(np.tile(np.eye(4) * 1e38, (9, 1, 1)).tolist()), intrinsics="[60, 60, 40, 24]"), "c2w"),
    (dict(camera="w-8", intrinsics=json.dumps([[60, 60, 40, 24]] * 5)), "intrinsics"),
])
def test_bad_camera_fields_are_400_naming_the_field(server, first_frame, fields, field):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = client.post("/v1/videos", **_form(first_frame, **fields))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field, response.text


def test_health_answers_while_camera_fields_are_parsed(server, first_frame, monkeypatch):
    """Camera parsing (up to MAX_CAMERA_FRAMES poses: ~0.1 s each) runs off the event loop: with four parses held
    mid-way, /health still answers."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from vidloom.families.sana_wm.camera import MAX_CAMERA_FRAMES, CameraInput

    parsing, release, real_build = threading.Semaphore(0), threading.Event(), CameraInput.build.__func__

    def held_build(cls, *args, **kwargs):
        parsing.release()
        release.wait(30)
        return real_build(cls, *args, **kwargs)

    monkeypatch.setattr(CameraInput, "build", classmethod(held_build))
    widest = _form(first_frame, camera=",".join(["wasdijkl-1"] * MAX_CAMERA_FRAMES), intrinsics="[60, 60, 40, 24]")
    with ThreadPoolExecutor(4) as pool, httpx.Client(base_url=server.url, timeout=60) as client:
        try:
            posts = [pool.submit(client.post, "/v1/videos", **widest) for _ in range(4)]
            # Two at once on the media pool (media_workers=2); on the event loop the second could never start.
            assert all(parsing.acquire(timeout=30) for _ in range(2)), "the camera parses did not run side by side"
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        finally:
            release.set()
        answers = [post.result() for post in posts]
        for answer in answers:
            assert answer.status_code in (200, 429), answer.text  # 429: the queue of 4 already held a job
            if answer.status_code == 200:
                client.post(f"/v1/videos/{answer.json()['id']}/cancel")


def test_cli_and_server_make_the_same_video(server, sana_dir, first_frame, tmp_path):
    cli_out = tmp_path / "cli.mp4"
    assert _generate(sana_dir, first_frame, cli_out, "--camera", "jw-8,w-8", "--intrinsics", "60,60,40,24") == 0
    with httpx.Client(base_url=server.url, timeout=120) as client:
        form = _form(first_frame, camera="jw-8,w-8", intrinsics="[60, 60, 40, 24]", seed="1")
        video_id = client.post("/v1/videos", **form).json()["id"]
        assert wait_for_status(client, video_id, {"completed"})["status"] == "completed"
        job = client.get(f"/v1/videos/{video_id}").json()
        (tmp_path / "http.mp4").write_bytes(client.get(f"/v1/videos/{video_id}/content").content)
    assert np.array_equal(read_video(cli_out)[0], read_video(tmp_path / "http.mp4")[0])
    assert job["parameters"]["camera"] == "jw-8,w-8" and job["parameters"]["intrinsics"] == [60, 60, 40, 24]


def test_cli_runs_with_the_shared_decode_and_prompt_options(sana_dir, first_frame, tmp_path):
    # --vae-tile, --prompt-cache and --offload-text-encoder load and run for SANA-WM (no refusal); 96-pixel tiles
    # every 64 on 128x128 (a 4x4 latent of the 32x VAE).
    out = tmp_path / "tiled.mp4"
    assert _generate(sana_dir, first_frame, out, "--camera", "w-8", "--intrinsics", "60,60,40,24", "--height", "128",
                     "--width", "128", "--vae-tile", "96", "--vae-tile-stride", "64", "--prompt-cache", "2",
                     "--offload-text-encoder") == 0
    assert read_video(out)[0].shape == (9, 128, 128, 3)
