"""bench/startup.py --floor: its bare-interpreter stages are built from the cached demo's model_index.json (the text
encoder's class), each stage is the one before it plus one line, every one runs (the last loads the demo's encoder and
tokenizer through transformers), and "own" runs generate after them in the same process, reporting its phases; a
cache it cannot read one demo from is refused, naming why."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from startup import FLOOR, floor_programs, floor_run  # noqa: E402


def test_the_stages_grow_one_line_each_and_the_last_loads_the_encoder(wan_demo_checkpoint: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / wan_demo_checkpoint.name).symlink_to(wan_demo_checkpoint)
    programs = floor_programs(cache)
    assert [stage for stage, _ in programs] == [stage for stage, _ in FLOOR]
    bodies = [program.removesuffix("; import os; os._exit(0)") for _, program in programs]
    for before, after in zip(bodies, bodies[1:]):
        assert after.startswith(before + "; "), (before, after)
    assert "UMT5EncoderModel.from_pretrained(" in bodies[-1]  # the Wan demo's model_index.json names it
    # each program runs with check=True: a stage that fails (a load that raises before os._exit) fails here
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VIDLOOM_CACHE": str(cache), "VIDLOOM_BENCH_DIR": str(tmp_path)}
    row = floor_run(ROOT, "wan2.1-demo", programs, env)
    assert all(row[stage]["cpu_s"] > 0 for stage, _ in FLOOR)
    assert {"checks", "weights", "generation", "write"} <= set(row["own"]), row["own"]
    assert (tmp_path / "out.mp4").is_file()  # generate ran to its end in the floor's process


def test_a_cache_without_exactly_one_demo_is_refused(wan_demo_checkpoint: Path, tmp_path: Path):
    with pytest.raises(SystemExit, match="holds 0"):
        floor_programs(tmp_path)
    for name in ("one", "two"):
        (tmp_path / name).symlink_to(wan_demo_checkpoint)
    with pytest.raises(SystemExit, match="holds 2"):
        floor_programs(tmp_path)
