"""The GPU check on the lent machine's image, simulated on CPU: no diffusers (until .whl is installed), no
PyAV, fastapi, ftfy, flash-attn or sageattention, a CUDA torch. The check must get through its environment
step, `import vidloom` must not need PyAV, and tests/gpu must collect without diffusers.

The image is simulated in a fresh interpreter: absent packages are `None` in sys.modules (what Python
does for a package that is not installed: ImportError, find_spec None), and torch.cuda answers as an
H200 would for the calls the environment step makes. Nothing touches a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ABSENT_ON_IMAGE = ("av", "fastapi", "ftfy", "flash_attn", "sageattention")

PRELUDE = """
import sys, types
for name in {absent!r}:
    sys.modules[name] = None
import torch
torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = lambda *a: "NVIDIA H200"
torch.cuda.get_device_capability = lambda *a: (9, 0)
torch.cuda.get_device_properties = lambda *a: types.SimpleNamespace(total_memory=143771 * 2**20)
"""


def _simulated(body: str, absent: tuple[str, ...], tmp_path: Path) -> subprocess.CompletedProcess:
    script = PRELUDE.format(absent=absent) + body
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'bench'}", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path, env=env)


def test_environment_step_passes_with_the_carried_diffusers_and_nothing_else(tmp_path):
    # diffusers stays importable here: on the image it comes from .whl (bench/gpu_check.sh --prepare).
    body = f"""
import sys, gpu_check
sys.argv = ["gpu_check.py", "--check-env", "--out", {str(tmp_path / 'out')!r}]
code = gpu_check.main()
import vidloom.generator, vidloom.cli  # import vidloom and the CLI without PyAV / fastapi
print("RC", code, sorted(m for m in {ABSENT_ON_IMAGE!r} if sys.modules.get(m) is not None))
"""
    proc = _simulated(body, ABSENT_ON_IMAGE, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RC 0 []" in proc.stdout, proc.stdout
    assert "gpu=NVIDIA H200" in proc.stdout and "cannot run" not in proc.stdout


def test_without_the_wheels_the_environment_step_says_to_prepare_them(tmp_path):
    body = f"""
import sys, gpu_check
sys.argv = ["gpu_check.py", "--check-env", "--out", {str(tmp_path / 'out')!r}]
print("RC", gpu_check.main())
"""
    proc = _simulated(body.replace("import sys, gpu_check", "import sys, importlib.metadata as md\n"
                                   "real = md.version\n"
                                   "def version(name):\n"
                                   "    if name == 'diffusers': raise md.PackageNotFoundError(name)\n"
                                   "    return real(name)\n"
                                   "md.version = version\n"
                                   "import gpu_check"), (*ABSENT_ON_IMAGE, "diffusers"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RC 2" in proc.stdout and "gpu_check.sh --prepare" in proc.stdout, proc.stdout


def test_tests_gpu_collect_without_diffusers_pyav_or_fastapi(tmp_path):
    body = f"""
import pytest
sys_exit = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", {str(ROOT)!r},
                        {str(ROOT / 'tests' / 'gpu')!r}])
print("RC", int(sys_exit))
"""
    proc = _simulated(body, (*ABSENT_ON_IMAGE, "diffusers"), tmp_path)
    assert "RC 0" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = [line for line in proc.stdout.splitlines() if "tests/gpu/" in line and "::" in line]
    assert len(collected) >= 20, proc.stdout[-2000:]
