"""The tiny checkpoint writers most tests build on write the same files on every fresh write.

The test's process and a second one with another hash seed (as two pytest runs get) each write a fresh folder;
every file must match byte for byte. Before the demo tokenizer was counted instead of trained, the `tokenizers` Unigram
trainer gave a different vocabulary per run, and frames generated from two fresh folders differed by up to
42 uint8 levels.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WRITE_TIMEOUT_S = 600  # the other process mostly imports diffusers (~10 s idle); generous for a loaded machine


def write_checkpoints(root: Path) -> None:
    """write_tiny_wan and one other writer that shares its tokenizer and text encoder."""
    from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
    from tests.helpers.wan_i2v_checkpoints import write_tiny_wan_i2v

    write_tiny_wan(root / "wan", TINY_A, seed=0)
    write_tiny_wan_i2v(root / "wan_i2v", TINY_A, seed=0)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_fresh_writes_in_two_processes_give_identical_files(tmp_path):
    # This process writes one folder, a second process with another hash seed writes the other.
    hash_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": hash_seed}
    script = "import sys, pathlib; from tests.unit.test_checkpoint_writers import write_checkpoints; " \
             "write_checkpoints(pathlib.Path(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "other")], cwd=REPO, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=WRITE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    write_checkpoints(tmp_path / "here")
    here, other = _files(tmp_path / "here"), _files(tmp_path / "other")
    assert "wan/tokenizer/tokenizer.json" in here and "wan_i2v/text_encoder/model.safetensors" in here
    assert sorted(here) == sorted(other)
    differing = [name for name in here if here[name] != other[name]]
    assert not differing, f"files that differ between two fresh writes: {differing}"
