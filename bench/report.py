"""What every benchmark prints and saves: a plain-text table, a JSON file, and the machine it ran on.

Run as a command, it writes the side-by-side table (bench/side_by_side.py): per family (mid-size random
checkpoints, bench/family_bench.py), vidloom default and float32 beside the reference at its default dtype and
at bfloat16: wall, CPU seconds, peak RSS, PSNR (chat: tokens/s at 16 streams, greedy token agreement).

    python bench/report.py [--families wan2.1-mid,cosmos3-chat-mid] [--runs 2] [--threads 1]
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def environment() -> dict[str, Any]:
    """Versions, hardware and load: enough to tell whether two result files are comparable."""
    import torch

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=RESULTS.parent).stdout.strip()
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git_commit": commit or None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "diffusers": version("diffusers"),
        "cache_dit": version("cache-dit"),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        # Other work on the machine inflates wall times; the load average says how much there was.
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def _cpu_times() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)  # (idle + iowait, total) in jiffies


def wait_for_quiet(max_wait_s: float = 120.0, busy_below: float = 0.15) -> float:
    """Wait (up to max_wait_s) until other processes use less than `busy_below` of the CPUs.

    On a shared 2-core machine another job's threads make ours spin-wait, which
    inflates wall and CPU time alike; starting each timed process on a quiet machine
    keeps runs comparable. Returns the busy fraction seen last (Linux only; 0 elsewhere).
    """
    if not Path("/proc/stat").exists():
        return 0.0
    deadline = time.monotonic() + max_wait_s
    while True:
        idle0, total0 = _cpu_times()
        time.sleep(0.5)
        idle1, total1 = _cpu_times()
        busy = 1 - (idle1 - idle0) / max(1, total1 - total0)
        if busy < busy_below or time.monotonic() > deadline:
            return round(busy, 3)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of frames in [0, 1]; inf when identical."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else float(10 * np.log10(1.0 / mse))


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    print(line)
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))


def write_json(name: str, payload: dict[str, Any], folder: Path | None = None) -> Path:
    folder = folder or RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    # JSON has no inf: identical outputs are written as the string "inf".
    text = json.dumps(payload, indent=2, default=str).replace("Infinity", '"inf"')
    path.write_text(text + "\n")
    print(f"wrote {path}")
    return path


def run_worker(script: str, args: list[str], max_wait_s: float) -> dict[str, Any]:
    """`python SCRIPT --worker ARGS` in a fresh process once the machine is quiet (comparable peak RSS, no
    shared warm caches): its last stdout line as JSON, plus how busy the machine was at the start."""
    busy = wait_for_quiet(max_wait_s)
    out = subprocess.run([sys.executable, script, "--worker", *args], capture_output=True, text=True, check=True)
    return {"busy_at_start": busy, **json.loads(out.stdout.strip().splitlines()[-1])}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from side_by_side import main

    sys.exit(main())
