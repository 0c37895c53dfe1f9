"""What the world-model benchmarks (bench/sana_wm.py, bench/world_session.py) share: the random checkpoint
they write once under a cache folder, a seeded first frame, one thread and float32, the load recorded before
each timed run, their common flags, and the result file (environment, summary, rows, wall time)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from report import environment, wait_for_quiet, write_json  # noqa: E402

CACHE = ROOT / "bench" / ".cache"


def cached_checkpoint(cache: Path, name: str, marker: str, write: Callable[[Path], Any]) -> Path:
    """`cache/name`, written by `write(folder)` unless `marker` (a file inside it) is already there."""
    folder = cache / name
    if not (folder / marker).exists():
        write(folder)
    return folder


def first_frame(height: int, width: int, seed: int) -> Any:
    """A seeded random RGB image: the request's first frame."""
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def clock() -> tuple[float, float]:
    """(wall, process CPU) seconds now."""
    return time.perf_counter(), time.process_time()


def before_run(max_wait: float) -> dict[str, Any]:
    """Wait (up to `max_wait` s) for a quiet machine; the 1-minute load and the CPUs' busy fraction then."""
    busy = wait_for_quiet(max_wait)
    return {"loadavg_1m": round(os.getloadavg()[0], 2), "busy_at_start": busy}


def parser(doc: str | None, max_wait: float, per: str) -> argparse.ArgumentParser:
    """The flags every world-model benchmark takes; the script adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny config (a smoke run, seconds)")
    parser.add_argument("--max-wait", type=float, default=None,
                        help=f"seconds to wait for a quiet machine per {per} ({max_wait:g}; 0 with --tiny)")
    parser.add_argument("--out", default=None, help="result file name under bench/results/")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the random checkpoint is written")
    return parser


def max_wait_of(args: argparse.Namespace, default: float) -> float:
    return args.max_wait if args.max_wait is not None else (0.0 if args.tiny else default)


def one_thread(float32: bool = True) -> None:
    """One torch thread (on a shared machine 2 threads spin-wait on a busy neighbour); vidloom's CPU dtype
    float32 when `float32` (the reference's: frames compare)."""
    import torch

    if float32:
        from vidloom.loading.precision import CPU_DTYPE_ENV

        os.environ[CPU_DTYPE_ENV] = "float32"
    torch.set_num_threads(1)


def save(name: str, what: str, config: dict[str, Any], env: dict[str, Any], summary: dict[str, Any],
         result: dict[str, Any], started: float) -> dict[str, Any]:
    """Write the result file bench/results/`name` (or the path given by --out) and return its payload."""
    payload = {"what": what, "config": config, "environment": env, "summary": summary, "frames": result["frames"],
               "rows": result["rows"], "wall_s": round(time.perf_counter() - started, 1)}
    write_json(name, payload)
    return payload


def start() -> tuple[float, dict[str, Any]]:
    """The wall clock at the start and the machine's description."""
    return time.perf_counter(), environment()
