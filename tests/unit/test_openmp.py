"""core.openmp: importing vidloom (the CLI, the server, the Python API) keeps libgomp spinning briefly on the engine's
worker thread, unless the user chose or torch is already loaded (the setting is read once, when torch loads its
OpenMP runtime); and the AsyncEngine's builder thread gives back its idle OpenMP team (release_thread_pool)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vidloom.core.openmp import SPIN_THEN_SLEEP, spin_then_sleep

ROOT = Path(__file__).resolve().parents[2]


def test_set_before_torch_loads_and_never_over_the_users_choice():
    environ: dict[str, str] = {}
    assert spin_then_sleep(environ, {}) and environ == SPIN_THEN_SLEEP
    mine = {"OMP_WAIT_POLICY": "PASSIVE"}
    assert not spin_then_sleep(mine, {}) and mine == {"OMP_WAIT_POLICY": "PASSIVE"}
    late: dict[str, str] = {}
    assert not spin_then_sleep(late, {"torch": object()}) and late == {}


CHILD = """
import os, sys
command = sys.argv[1]
seen = {}
class FirstTorchImport:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen["env"] = (os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"))
        return None
sys.meta_path.insert(0, FirstTorchImport())
if command == "cli":
    from vidloom.cli import main
    main(["models"])
else:  # the Python API a server embeds
    from vidloom.runtime.async_engine import AsyncEngine
print("at torch's import:", *seen["env"])
"""


def _at_torch_import(command: str, user: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in SPIN_THEN_SLEEP}
    out = subprocess.run([sys.executable, "-c", CHILD, command], env={**env, **user, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, check=True, timeout=300)
    return out.stdout.splitlines()[-1]


def test_the_command_and_the_api_set_it_before_torch_is_imported():
    assert _at_torch_import("cli", {}) == "at torch's import: ACTIVE 300000"
    assert _at_torch_import("api", {}) == "at torch's import: ACTIVE 300000"
    assert _at_torch_import("api", {"OMP_WAIT_POLICY": "PASSIVE"}) == "at torch's import: PASSIVE None"


POOL_CHILD = """
import os, torch
from vidloom.core.openmp import release_thread_pool
torch.set_num_threads(2)
torch.randn(512, 512) @ torch.randn(512, 512)  # a parallel region: this thread's pool now has a team thread
def threads():
    return len(os.listdir("/proc/self/task"))
before = threads()
print(release_thread_pool(), before - threads(), release_thread_pool(maps="/nonexistent"))
"""


def test_release_thread_pool_frees_the_callers_team_threads():
    if not Path("/proc/self/maps").exists():
        pytest.skip("reads /proc/self/maps (Linux)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", POOL_CHILD], env=env, capture_output=True, text=True, check=True,
                         timeout=300)
    released, freed, elsewhere = out.stdout.split()
    assert released == "True" and int(freed) >= 1 and elsewhere == "False", out.stdout
