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

# Runs commands one after another in a fresh interpreter, printing after each which watched packages are imported.
PROGRAM = """
import json, sys
from vidloom.cli import main
for argv in {argvs!r}:
    try:
        main(argv)
    except SystemExit:
        pass
    print("imported:", json.dumps(sorted(name for name in {watched!r} if name in sys.modules)))
"""
HEAVY = ("torch", "numpy", "transformers", "diffusers", "av", "fastapi", "uvicorn", "psycopg", "yaml", "scipy",
         "sympy", "PIL")


def imported(argvs: list[list[str]], cache: Path) -> list[list[str]]:
    """The watched packages imported once each command has run, all in one interpreter (so each list holds the
    ones before it: run the lightest first)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VIDLOOM_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PROGRAM.format(argvs=argvs, watched=HEAVY)], capture_output=True,
                          text=True, env=env, cwd=cache, timeout=300)
    assert done.returncode == 0, done.stderr
    return [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("imported: ")]


def test_help_and_models_import_nothing_they_do_not_need(tmp_path: Path):
    """One interpreter (a start spared): the help pages first, then `models` (which may import what they did)."""
    top_help, generate_help, models = imported([["--help"], ["generate", "--help"], ["models"]], tmp_path)
    assert top_help == [] and generate_help == []
    assert not {"transformers", "diffusers", "av", "fastapi", "psycopg", "scipy", "sympy"} & set(models), models


@pytest.mark.slow
def test_generate_on_the_wan_demo_leaves_diffusers_and_serving_alone(demo_cache: Path, tmp_path: Path):
    argv = ["generate", "--prompt", "a cat", "--height", "32", "--width", "48", "--frames", "5", "--steps", "1",
            "-o", str(tmp_path / "cat.mp4")]
    [loaded] = imported([argv], demo_cache)
    assert {"torch", "transformers", "av"} <= set(loaded), loaded  # it did run: the model and the encoder
    # (sympy comes with transformers' encoder modules, through torch._dynamo: not ours to skip)
    assert not {"diffusers", "fastapi", "uvicorn", "psycopg"} & set(loaded), loaded
