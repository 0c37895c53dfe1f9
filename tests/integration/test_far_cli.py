"""`vidloom generate` on an AnyFlow-FAR directory: a progress bar per chunk and per rollout step, then the mp4."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from vidloom.media.video import read_video


def test_generate_shows_chunk_and_step_progress(tmp_path):
    model = write_tiny_far(tmp_path / "far", FAR_A)
    out = tmp_path / "far.mp4"
    env = {**os.environ, "VIDLOOM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "vidloom.cli", "generate", "--model", str(model), "--prompt", "a cat",
         "--height", "32", "--width", "32", "--frames", "17", "--steps", "2", "--seed", "1", "--output", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    # tqdm's last state of each bar: 3 chunks of 2 steps each, every chunk decoded as it finished.
    finals = {name: done for name, done in re.findall(r"(chunks|rollout|decode): 100%\|[^|]*\| (\d+/\d+)", proc.stderr)}
    assert finals == {"chunks": "3/3", "rollout": "6/6", "decode": "3/3"}, proc.stderr
    frames, _ = read_video(out)
    assert frames.shape == (17, 32, 32, 3)
