"""The CLI refuses degenerate numbers like the server and the Python API: exit 2, one line naming the flag."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_degenerate_flow_shift_exits_2_naming_the_flag(demo_cache, tmp_path):
    # --shift 5e-324 used to run every step and fail with NaN latents after the whole denoise.
    out = tmp_path / "x.mp4"
    env = {**os.environ, "VIDLOOM_CACHE": str(demo_cache)}
    proc = subprocess.run([sys.executable, "-m", "vidloom.cli", "generate", "--prompt", "x", "--shift", "5e-324",
                           "--frames", "5", "--height", "32", "--width", "48", "--output", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "--shift" in proc.stderr and ">= 0.01" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
