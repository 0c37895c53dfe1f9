"""Acceleration flags of `vidloom generate`, run as a user runs them."""

from __future__ import annotations

from tests.helpers.cli_runs import run_cli as _run
from vidloom.media.video import read_video

ARGS = ["--steps", "3", "--frames", "5", "--height", "32", "--width", "48", "--seed", "9"]


def test_cached_batched_generation_runs(demo_cache, tmp_path):
    out = tmp_path / "clip.mp4"
    proc = _run(["generate", "--prompt", "a cat", "--output", str(out), *ARGS,
                 "--attention-backend", "sdpa", "--cfg-mode", "batched",
                 "--step-cache", "fbcache", "--step-cache-threshold", "0.2"], demo_cache)
    assert proc.returncode == 0, proc.stderr
    frames, _ = read_video(out)
    assert frames.shape == (5, 32, 48, 3)


def test_uninstalled_attention_backend_fails_at_load_with_exit_2(demo_cache, tmp_path):
    out = tmp_path / "clip.mp4"
    proc = _run(["generate", "--prompt", "a cat", "--output", str(out), *ARGS, "--attention-backend", "flash",
                 "--device", "cpu"], demo_cache)
    assert proc.returncode == 2
    assert "attention backend 'flash' needs a CUDA device" in proc.stderr and "Traceback" not in proc.stderr
    assert "denoise" not in proc.stderr  # refused before any step ran
    assert not out.exists()
