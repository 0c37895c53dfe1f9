"""OpenMP's wait policy for a process that uses vidloom, set when vidloom is imported before torch loads its OpenMP
runtime (libgomp): `import vidloom` (the package's __init__) runs it, so the `vidloom` command, `vidloom serve` and
a Python program that imports vidloom (AsyncEngine, VideoGenerator) before torch all get it.

The AsyncEngine runs every forward on its device worker thread, which gets an OpenMP team of its own beside the
main thread's (the load runs there). libgomp then counts more threads than CPUs and cuts how long an idle team
thread spins before it sleeps from about 300k iterations to 100, so each of the many small parallel regions of a
decode step wakes sleeping threads. Measured on 2 cores: a 16-token forward of the mid Qwen3-Omni thinker
(bench/family_bench.py) took 33 ms on a second thread against 13 ms on the main thread; OMP_WAIT_POLICY=ACTIVE
with GOMP_SPINCOUNT=300000 (libgomp's own spin-then-sleep when it is not oversubscribed) gave 17 ms, and 16 chat
streams of 48 tokens went from 1.8 s to 1.2-1.4 s; a Wan denoise (large GEMMs) is unchanged (6.4 s). ACTIVE alone
would spin for minutes: the idle main team would then take a core from the worker's. A process with one OpenMP
team (no worker thread) behaves as without the setting: 300k spins is libgomp's default when not oversubscribed.

A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept, and nothing is set once torch is loaded (the setting is
read once, when libgomp loads; a program that imports torch first keeps libgomp's default: set the two variables
in its environment to get the same). Child processes inherit the variables (bench/side_by_side.py sets them for
its vidloom workers, which import torch first).
"""

from __future__ import annotations

import os
import sys
from typing import MutableMapping

SPIN_THEN_SLEEP = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}


def spin_then_sleep(environ: MutableMapping[str, str] = os.environ, modules: dict = sys.modules) -> bool:
    """Set SPIN_THEN_SLEEP in `environ` unless torch is loaded or the user set either; True when set."""
    if "torch" in modules or any(name in environ for name in SPIN_THEN_SLEEP):
        return False
    environ.update(SPIN_THEN_SLEEP)
    return True


OMP_PAUSE_SOFT = 1  # omp_pause_resource_t's omp_pause_soft (OpenMP 5.0)


def release_thread_pool(maps: str = "/proc/self/maps") -> bool:
    """Release the calling thread's OpenMP team threads (libgomp's `omp_pause_resource_all(omp_pause_soft)`, which
    frees only the caller's pool); True when released. The AsyncEngine calls it from the thread that builds it,
    which loaded the model: from then on its forwards run on the worker thread, and the loading thread's idle team
    only made libgomp count more threads than CPUs (its throttled mode). Measured on 2 cores, quiet moments: 6 MoE
    layers of the mid Qwen3-Omni thinker over 16 tokens took 24-29 ms on a second thread while the first thread's
    pool existed against 9.8-10.3 ms once released (10.2 ms on the first thread); with SPIN_THEN_SLEEP 17.8 against
    14.2 ms. A thread that runs a parallel region again gets a new pool. False where torch's OpenMP is not libgomp
    (found in `maps`) or the call fails (inside a parallel region)."""
    import ctypes

    try:
        with open(maps) as lines:
            path = next((line.split()[-1] for line in lines if "/libgomp" in line), None)
    except OSError:  # not Linux
        return False
    if path is None:
        return False
    try:
        pause = ctypes.CDLL(path).omp_pause_resource_all
    except (OSError, AttributeError):  # a libgomp older than OpenMP 5.0
        return False
    return pause(OMP_PAUSE_SOFT) == 0
