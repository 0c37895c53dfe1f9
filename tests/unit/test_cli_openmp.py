"""cli.openmp: the CLI keeps libgomp spinning briefly on the engine's worker thread, unless the user chose or torch is
already loaded (the setting is read once, when torch loads its OpenMP runtime)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vidloom.cli.openmp import SPIN_THEN_SLEEP, spin_then_sleep

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
seen = {}
class FirstTorchImport:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen["env"] = (os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"))
        return None
sys.meta_path.insert(0, FirstTorchImport())
from vidloom.cli import main
main(["models"])
print("at torch's import:", *seen["env"])
"""


def test_the_command_sets_it_before_torch_is_imported():
    env = {k: v for k, v in os.environ.items() if k not in SPIN_THEN_SLEEP}
    out = subprocess.run([sys.executable, "-c", CHILD], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, check=True, timeout=300)
    assert out.stdout.splitlines()[-1] == "at torch's import: ACTIVE 300000", out.stderr
