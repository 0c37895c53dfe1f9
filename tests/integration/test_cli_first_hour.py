"""The CLI as a new user meets it: one-line errors before any load, Ctrl-C, output formats, hub ids.

In this process (tests/helpers/cli_runs.py) but for Ctrl-C (a real signal to a real process), the hub id
(huggingface_hub reads HF_HOME when first imported) and --verbose's loading bars (transformers' verbosity is
process-wide)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli_runs import CliRun
from tests.helpers.cli_runs import run_cli as _run
from vidloom.media.video import read_video

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--steps", "2", "--frames", "5", "--height", "32", "--width", "48", "--seed", "3"]


def _env(cache: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "VIDLOOM_CACHE": str(cache), "PYTHONPATH": str(ROOT), **extra}


def _process(args: list[str], cache: Path, **extra: str) -> subprocess.CompletedProcess:
    """In a subprocess, where process-wide state is the point (huggingface_hub reads HF_HOME at import)."""
    return subprocess.run([sys.executable, "-m", "vidloom.cli", *args], capture_output=True, text=True,
                          env=_env(cache, **extra), timeout=300)


def _one_error_line(proc: CliRun | subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("args, needles", [
    (["--output", "/proc/x.mp4"], ["--output", "/proc"]),
    (["--output", "{tmp}"], ["--output", "is a directory"]),
    (["--output", "{tmp}/clip.avi"], ["--output", ".avi", ".mp4"]),
    (["--output", "{tmp}/sound.wav"], ["--output", "no sound"]),  # the demo model is silent
    (["--output", "{tmp}/no/such/dir/x.mp4"], ["--output", "no/such/dir does not exist"]),  # not created (as ffmpeg)
    (["--output", "{tmp}/still.jpg"], ["--output", "jpeg holds one image", "17 frames"]),  # the card's default
    (["--output", "{tmp}/still.webp", "--frames", "5"], ["--output", "webp holds one image", "5 frames"]),
    (["--audio-out", "{tmp}/a.mp3"], ["--audio-out", ".mp3", ".wav"]),
    (["--audio-out", "{tmp}"], ["--audio-out", "is a directory"]),
    (["--audio-out", "/proc/a.wav"], ["--audio-out", "/proc"]),
    (["--audio-out", "{tmp}/a.wav"], ["--audio-out", "no sound"]),
    (["--device", "cuda"], ["--device", "CUDA"]),
    (["--device", "gpu"], ["--device", "gpu"]),
    (["--dtype", "float8"], ["--dtype", "float8"]),
    (["--vae-tile", "0"], ["--vae-tile"]),
    (["--steps", "0"], ["--steps", ">= 1"]),
    (["--frames", "6"], ["--frames", "4k+1"]),
    (["--sampler", "ddim"], ["--sampler", "ddim"]),
])
def test_generate_errors_are_one_line_exit_2_before_the_model_loads(demo_cache, tmp_path, args, needles):
    if args[:2] == ["--device", "cuda"]:
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA is present here")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--output" not in args:
        args += ["--output", str(tmp_path / "out.mp4")]
    started = time.perf_counter()
    proc = _run(["generate", "--prompt", "x", *args], demo_cache)
    _one_error_line(proc, *needles)
    assert "note:" not in proc.stderr  # refused before the card's notes, i.e. before loading
    assert list(tmp_path.iterdir()) == []
    assert time.perf_counter() - started < 60


def test_truncated_safetensors_names_the_file(demo_cache, wan_demo_checkpoint, tmp_path):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(wan_demo_checkpoint, ckpt)
    weights = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out.mp4"
    line = _one_error_line(_run(["generate", "--model", str(ckpt), "--prompt", "x", "--output", str(out), *SMALL],
                                demo_cache), str(weights))
    assert "safetensors" in line and not out.exists()


def test_serve_with_an_unusable_data_dir_fails_before_serving(demo_cache):
    proc = _run(["serve", "--data-dir", "/proc/nope", "--port", "0"], demo_cache)
    _one_error_line(proc, "--data-dir", "/proc/nope")
    assert "serving" not in proc.stdout


@pytest.mark.parametrize("args, flag", [(["--slots", "0"], "--slots"), (["--policy", "lifo"], "--policy"),
                                        (["--served-model-name", " "], "--served-model-name")])
def test_serve_setting_errors_name_the_flag(demo_cache, tmp_path, args, flag):
    proc = _run(["serve", "--data-dir", str(tmp_path / "d"), "--port", "0", *args], demo_cache)
    _one_error_line(proc, flag)


def test_version_and_serve_synopsis(demo_cache):
    import vidloom

    proc = _run(["--version"], demo_cache)
    assert proc.returncode == 0 and proc.stdout.strip() == f"vidloom {vidloom.__version__}"
    usage = _run(["serve", "--help"], demo_cache).stdout
    for flag in ("MODEL", "--served-model-name", "--data-dir", "--fp8", "--vae-tile", "--sp"):
        assert flag in usage


def test_serve_takes_the_model_positionally_and_once():
    from vidloom.cli import build_parser

    args = build_parser().parse_args(["serve", "wan2.1-demo", "--served-model-name", "my-model"])
    assert args.model_arg == "wan2.1-demo" and args.served_model_name == "my-model"
    _one_error_line(_run(["serve", "a", "--model", "b"]), "--model")


@pytest.mark.parametrize("suffix, frames", [(".webm", 5), (".gif", 5)])
def test_output_extension_picks_the_format(demo_cache, tmp_path, suffix, frames):
    out = tmp_path / f"clip{suffix}"
    proc = _run(["generate", "--prompt", "a cat", "--output", str(out), *SMALL], demo_cache)
    assert proc.returncode == 0, proc.stderr
    decoded, _ = read_video(out)
    assert decoded.shape == (frames, 32, 48, 3)
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temp file left


def test_a_one_frame_request_writes_a_jpg(demo_cache, tmp_path):
    out = tmp_path / "still.jpg"
    proc = _run(["generate", "--prompt", "a cat", "--output", str(out), *SMALL[:2], "--frames", "1", *SMALL[4:]],
                demo_cache)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:2] == b"\xff\xd8" and [p.name for p in tmp_path.iterdir()] == [out.name]  # JPEG SOI


def test_png_output_writes_a_numbered_sequence(demo_cache, tmp_path):
    proc = _run(["generate", "--prompt", "a cat", "--output", str(tmp_path / "f.png"), *SMALL], demo_cache)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"f_{i:04d}.png" for i in range(5)]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_progress_bars_close_before_decode_and_loading_bars_are_quiet(demo_cache, tmp_path):
    proc = _run(["generate", "--prompt", "a cat", "--output", str(tmp_path / "o.mp4"), *SMALL], demo_cache)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "Loading weights" not in err and "Writing model shards" not in err
    denoise_done = err.index("denoise: 100%")
    assert denoise_done < err.index("decode:")  # the denoise bar finished before decode began
    final = err[denoise_done:].split("\n", 1)[0].split("\r")[0]
    assert "s/step" not in final or "step/s" in final  # rate of its own steps, not decode's time
    # a process of its own: transformers' verbosity is process-wide, and a quiet run before it set it to errors
    verbose = _process(["generate", "--prompt", "a cat", "--output", str(tmp_path / "v.mp4"), "--verbose", *SMALL],
                       demo_cache)
    assert verbose.returncode == 0 and "Loading weights" in verbose.stderr


def test_long_prompt_warns_on_one_line(demo_cache, tmp_path):
    proc = _run(["generate", "--prompt", " ".join(["cat"] * 600), "--output", str(tmp_path / "o.mp4"), *SMALL],
                demo_cache)
    assert proc.returncode == 0, proc.stderr
    [warning] = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert "tokens; the text encoder reads the first 512" in warning


def test_ctrl_c_cancels_at_a_step_leaves_no_file_and_exits_130(demo_cache, tmp_path):
    out = tmp_path / "long.mp4"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vidloom.cli", "generate", "--prompt", "a cat", "--output", str(out),
         "--steps", "2000", "--frames", "5", "--height", "32", "--width", "48"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(demo_cache),
    )
    seen = b""
    while b"denoise:" not in seen:  # the first progress line
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, seen
        seen += chunk
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=60)
    text = (seen + rest).decode()
    assert proc.returncode == 130, text
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.startswith("cancelled")]
    assert len(lines) == 1 and lines[0].startswith("cancelled at step ") and lines[0].endswith("/2000"), text
    step = int(lines[0].split()[3].split("/")[0])
    assert 1 <= step < 2000
    assert "Traceback" not in text
    assert list(tmp_path.iterdir()) == []


def test_hub_repo_id_loads_from_an_offline_cache(demo_cache, wan_demo_checkpoint, tmp_path):
    """A fake HF cache (models--org--name/snapshots/<rev>/..., refs/main) holding the demo checkpoint."""
    import shutil

    hf_home = tmp_path / "hf"
    repo = hf_home / "hub" / "models--tiny-org--tiny-wan"
    revision = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(wan_demo_checkpoint,
                    repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    out = tmp_path / "o.mp4"
    proc = _process(["generate", "--model", "tiny-org/tiny-wan", "--prompt", "a cat", "--output", str(out), *SMALL],
                    demo_cache, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, proc.stderr
    assert read_video(out)[0].shape == (5, 32, 48, 3)
    missing = _process(["generate", "--model", "tiny-org/absent", "--prompt", "x", "--output",
                        str(tmp_path / "n.mp4")], demo_cache, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    _one_error_line(missing, "tiny-org/absent", "hf download tiny-org/absent", "HF_HUB_OFFLINE")
