"""`vidloom fleet up` through a subprocess: a taken address fails at once, before Ray or any model starts."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path


def test_fleet_up_on_a_taken_port_fails_before_starting_ray(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        card = tmp_path / "fleet.yaml"
        card.write_text(f"store: postgresql://vidloom@127.0.0.1:1/none\ndata_dir: {tmp_path}\nport: {port}\n"
                        "fleet:\n  models:\n    - {model: wan2.1-demo}\n")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "vidloom.cli", "fleet", "up", "--config", str(card)],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "ray" not in done.stderr.lower()  # nothing of Ray was started
    assert time.monotonic() - started < 60
