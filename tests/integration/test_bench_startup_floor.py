"""bench/startup.py --floor: its bare-interpreter stages are built from the cached demo's model_index.json (the text
encoder's class), each stage is the one before it plus one line, and the last one really loads the demo's encoder
and tokenizer through transformers; a cache it cannot read one demo from is refused, naming why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from startup import FLOOR, floor_programs  # noqa: E402


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
    # a failed load raises before the program's os._exit(0): the status says whether it loaded
    done = subprocess.run([sys.executable, "-c", programs[-1][1]], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_cache_without_exactly_one_demo_is_refused(wan_demo_checkpoint: Path, tmp_path: Path):
    with pytest.raises(SystemExit, match="holds 0"):
        floor_programs(tmp_path)
    for name in ("one", "two"):
        (tmp_path / name).symlink_to(wan_demo_checkpoint)
    with pytest.raises(SystemExit, match="holds 2"):
        floor_programs(tmp_path)
