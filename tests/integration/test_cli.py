"""The `vidloom` CLI as a user runs it, with the demo model (in this process: tests/helpers/cli_runs.py)."""

from __future__ import annotations

from tests.helpers.cli_runs import run_cli as _run
from vidloom.media.video import read_video


def test_generate_with_default_demo_model(demo_cache, tmp_path):
    out = tmp_path / "clip.mp4"
    proc = _run(["generate", "--prompt", "a cat walks on the beach", "--output", str(out),
                 "--steps", "2", "--frames", "5", "--height", "32", "--width", "48", "--seed", "9"], demo_cache)
    assert proc.returncode == 0, proc.stderr
    assert "RANDOM weights" in proc.stderr  # the demo says plainly what it is
    assert "denoise" in proc.stderr and "decode" in proc.stderr  # progress bars
    assert f"wrote {out.resolve()}" in proc.stdout
    assert "wall time" in proc.stdout and "peak memory" in proc.stdout
    frames, fps = read_video(out)
    assert frames.shape == (5, 32, 48, 3) and fps == 8


def test_models_lists_registered_cards(demo_cache):
    proc = _run(["models"], demo_cache)
    assert proc.returncode == 0
    for model_id in ("wan2.1-demo", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b"):
        assert model_id in proc.stdout


def test_bad_input_exits_2_naming_the_field(demo_cache, tmp_path):
    proc = _run(["generate", "--prompt", "x", "--frames", "6", "--output", str(tmp_path / "x.mp4")], demo_cache)
    assert proc.returncode == 2
    assert "--frames" in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not (tmp_path / "x.mp4").exists()


def test_unknown_model_exits_2(demo_cache):
    proc = _run(["generate", "--model", "nope", "--prompt", "x"], demo_cache)
    assert proc.returncode == 2 and "unknown model 'nope'" in proc.stderr


def test_deploy_flags_build_the_deploy_config():
    from vidloom.cli import build_parser
    from vidloom.cli.deploy_args import deploy_config

    args = build_parser().parse_args([
        "generate", "--prompt", "x", "--fp8", "--compile", "--compile-backend", "aot_eager",
        "--warmup", "32x48x5", "--warmup", "480x832x81", "--offload-text-encoder", "--prompt-cache", "8",
        "--vae-tile", "256",
    ])
    deploy = deploy_config(args)
    assert deploy.fp8_weights and deploy.compile and deploy.compile_backend == "aot_eager"
    assert deploy.warmup_shapes == ((32, 48, 5), (480, 832, 81))
    assert deploy.offload_text_encoder and deploy.prompt_cache_size == 8 and deploy.vae_tile == 256


def test_bad_deploy_option_exits_2(demo_cache):
    proc = _run(["generate", "--prompt", "x", "--vae-tile", "20"], demo_cache)
    assert proc.returncode == 2 and "vae_tile" in proc.stderr and "Traceback" not in proc.stderr


def test_models_lists_the_wan_family_with_tasks(demo_cache):
    proc = _run(["models"], demo_cache)
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert "i2v,t2v" in lines["wan2.2-ti2v-5b"] and "i2v" in lines["wan2.1-i2v-14b-480p"]
    assert "wan2.2" in lines["wan2.2-t2v-a14b"] and "t2v,v2v" in lines["wan2.1-demo"]


def test_video_to_video_and_a_refused_image(demo_cache, tmp_path):
    import numpy as np

    from vidloom.media.video import write_video

    source = write_video(np.random.default_rng(0).integers(0, 255, (5, 32, 48, 3), dtype=np.uint8), 8,
                         tmp_path / "in.mp4")
    out = tmp_path / "v2v.mp4"
    proc = _run(["generate", "--prompt", "a cat", "--video", str(source), "--strength", "0.5", "--steps", "2",
                 "--height", "32", "--width", "48", "--output", str(out)], demo_cache)
    assert proc.returncode == 0, proc.stderr
    assert read_video(out)[0].shape == (5, 32, 48, 3)
    png = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (48, 32)).save(png)
    proc = _run(["generate", "--prompt", "a cat", "--image", str(png), "--output", str(tmp_path / "x.mp4")], demo_cache)
    assert proc.returncode == 2 and "image" in proc.stderr and "Traceback" not in proc.stderr
