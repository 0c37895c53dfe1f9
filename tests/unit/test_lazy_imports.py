"""A command imports what it needs and no more: `vidloom --help` no torch, `vidloom models` no transformers (the
cards are data), `generate` on the Wan demo no diffusers, server or database packages (issue #36, a fast start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs one command in a fresh interpreter, then prints which of the watched packages it imported.
PROGRAM = """
import json, sys
from vidloom.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print(json.dumps(sorted(name for name in {watched!r} if name in sys.modules)))
"""
HEAVY = ("torch", "numpy", "transformers", "diffusers", "av", "fastapi", "pydantic", "uvicorn", "psycopg", "yaml",
         "scipy", "sympy", "PIL")


def imported(argv: list[str], cache: Path, watched: tuple[str, ...] = HEAVY) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VIDLOOM_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PROGRAM.format(argv=argv, watched=watched)], capture_output=True,
                          text=True, env=env, cwd=cache, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_help_imports_nothing_heavy(tmp_path: Path):
    assert imported(["--help"], tmp_path) == []
    assert imported(["generate", "--help"], tmp_path) == []


def test_models_reads_the_cards_without_transformers_or_media(tmp_path: Path):
    loaded = imported(["models"], tmp_path)
    assert not {"transformers", "diffusers", "av", "fastapi", "psycopg", "scipy", "sympy"} & set(loaded), loaded


@pytest.mark.slow
def test_generate_on_the_wan_demo_leaves_diffusers_and_serving_alone(demo_cache: Path, tmp_path: Path):
    argv = ["generate", "--prompt", "a cat", "--height", "32", "--width", "48", "--frames", "5", "--steps", "1",
            "-o", str(tmp_path / "cat.mp4")]
    clip = "transformers.models.clip.modeling_clip"  # Wan's image encoder: image-to-video checkpoints only
    loaded = imported(argv, demo_cache, (*HEAVY, clip))
    assert {"torch", "transformers", "av"} <= set(loaded), loaded  # it did run: the model and the encoder
    # (sympy comes with transformers' encoder modules, through torch.distributed.tensor and torch._dynamo: not ours
    # to skip; see docs/performance.md, "Start-up")
    assert not {"diffusers", "fastapi", "pydantic", "uvicorn", "psycopg", clip} & set(loaded), loaded
