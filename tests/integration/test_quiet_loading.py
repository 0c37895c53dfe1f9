"""The Python API is as quiet as the CLI: no transformers warnings or loading bars, nothing from the demo
writers' tokenizer training; the program's own logging settings are back as they were after the load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A user's program: it sets transformers' verbosity itself (info), loads a demo that is written first into an
# empty cache (tokenizer training, save_pretrained), generates, and prints what its settings are afterwards.
PROGRAM = """
import transformers
from transformers.utils import logging
from huggingface_hub.utils import are_progress_bars_disabled
from vidloom import VideoGenerator

{setup}
before = (logging.get_verbosity(), logging.is_progress_bar_enabled(), are_progress_bars_disabled())
generator = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu")
generator.generate("a cat", num_inference_steps=1, num_frames=5, height=32, width=32)
after = (logging.get_verbosity(), logging.is_progress_bar_enabled(), are_progress_bars_disabled())
print("RESULT", before == after, after)
"""


def _run(tmp_path: Path, setup: str = "", **env_extra: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.endswith("_VERBOSITY")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", VIDLOOM_CACHE=str(tmp_path / "cache"), **env_extra)
    return subprocess.run([sys.executable, "-c", PROGRAM.format(setup=setup)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)


def test_python_api_prints_nothing_and_restores_the_programs_settings(tmp_path: Path):
    out = _run(tmp_path, setup="logging.set_verbosity_info()\nlogging.enable_progress_bar()")
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr  # no torchvision warning, no "Loading weights" / "Writing model shards" bar
    assert out.stdout.splitlines() == ["RESULT True (20, True, False)"], out.stdout  # info (20), bars on


def test_transformers_verbosity_env_brings_the_messages_back(tmp_path: Path):
    out = _run(tmp_path, TRANSFORMERS_VERBOSITY="warning")
    assert out.returncode == 0, out.stderr
    assert "Loading weights" in out.stderr, out.stderr  # transformers' bar over the text encoder's load
