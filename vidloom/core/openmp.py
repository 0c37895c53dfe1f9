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
