"""OpenMP's wait policy for a `vidloom` process, set before torch loads its OpenMP runtime (libgomp).

The engine runs every forward on its device worker thread, which gets an OpenMP team of its own beside the main
thread's (the load runs there). libgomp then counts more threads than CPUs and cuts how long an idle team thread
spins before it sleeps from about 300k iterations to 1k, so each of the many small parallel regions of a decode
step wakes sleeping threads. Measured on 2 cores: a 16-token forward of the mid Qwen3-Omni thinker
(bench/family_bench.py) took 33 ms on a second thread against 13 ms on the main thread; OMP_WAIT_POLICY=ACTIVE
with GOMP_SPINCOUNT=300000 (libgomp's own spin-then-sleep when it is not oversubscribed) gave 17 ms, and 16 chat
streams of 48 tokens went from 1.8 s to 1.2-1.4 s; a Wan denoise (large GEMMs) is unchanged (6.4 s). ACTIVE alone
would spin for minutes: the idle main team would then take a core from the worker's.
A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept, and nothing is set once torch is loaded (in-process callers
of `main`, where it would no longer take effect).
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
