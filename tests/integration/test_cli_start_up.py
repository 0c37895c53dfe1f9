"""`vidloom generate --timings`: one row per phase from process start on stderr, the stdout lines scripts read
unchanged, and the process gone right after its last line (no interpreter teardown; issue #36)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WALL = re.compile(r"^wall time ([\d.]+)s from process start \(load ([\d.]+)s, generation ([\d.]+)s\), peak memory",
                  re.MULTILINE)
TIMING = re.compile(r"^timing (.+?) ([\d.]+)s(?: ([\d.]+)s cpu)?$", re.MULTILINE)
PHASES = ["start-up", "checks", "libraries", "checkpoint", "weights", "warmup", "load (rest)", "generation", "write", "total"]


def test_timings_rows_add_up_and_stdout_keeps_its_lines(demo_cache: Path, tmp_path: Path):
    out = tmp_path / "cat.mp4"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VIDLOOM_CACHE": str(demo_cache), "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "vidloom.cli", "generate", "--prompt", "a cat", "--height", "32",
                           "--width", "48", "--frames", "5", "--steps", "1", "--seed", "1", "-o", str(out),
                           "--timings"], capture_output=True, text=True, env=env, timeout=300)
    measured = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert out.is_file()
    assert not TIMING.search(done.stdout)  # scripts read stdout: the table goes to stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["wrote", "wall"]
    wall, load, generation = (float(v) for v in WALL.search(done.stdout).groups())
    rows = {name: (float(seconds), cpu) for name, seconds, cpu in TIMING.findall(done.stderr)}
    assert list(rows) == PHASES, done.stderr
    total = rows.pop("total")[0]
    # the rows split the process's age at the last one; each printed to 3 decimals
    assert abs(sum(seconds for seconds, _ in rows.values()) - total) < 0.01 * len(rows)
    assert abs(rows["generation"][0] - generation) < 0.1 + 0.05 * generation
    load_parts = sum(rows[name][0] for name in ("checkpoint", "weights", "warmup", "load (rest)"))
    assert abs(load_parts - load) < 0.1 + 0.05 * load
    assert wall - 0.1 <= total <= measured
    # The process ends at its last line: what the parent saw past `total` is the fork and the exec, not the
    # interpreter freeing torch's modules (2-4 s of teardown before; 1 s leaves room for a loaded machine).
    assert measured - total < 1.0 + 0.05 * measured, (measured, total)
