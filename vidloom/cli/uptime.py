"""How long this process has run: the CLI's "wall time" counts from process start (interpreter, imports and
load included), as `time` in a shell would."""

from __future__ import annotations

import os
import time

_FIRST_SEEN = time.monotonic()  # where /proc is missing: from this module's import, early in `vidloom`


def process_seconds() -> float:
    """Seconds since this process started (Linux: from /proc; elsewhere: since vidloom.cli was imported)."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0])
        return max(0.0, now - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22 of stat(5): starttime
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _FIRST_SEEN
