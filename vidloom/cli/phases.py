"""Where a command's time went, phase by phase from process start (`vidloom generate --timings`).

The first phase, "start-up", is the interpreter and the imports up to the command's first line; the others
are marked by the command as each ends. bench/startup.py reads the table to find what a fresh process pays.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from vidloom.cli.uptime import process_seconds

TIMING_LINE = "timing"  # each row on stderr: "timing <phase> <wall seconds>s <CPU seconds>s cpu"


class PhaseClock:
    """Phase ends in process seconds (wall, and CPU of all threads: on a shared machine wall time swings with
    the load, CPU time much less); `table` turns them into each phase's own duration."""

    def __init__(self) -> None:
        self._ends: list[tuple[str, float]] = [("start-up", process_seconds())]
        self._cpu: dict[str, float] = {"start-up": time.process_time()}

    def mark(self, phase: str) -> None:
        """`phase` ended now (it began where the previous one ended)."""
        self._ends.append((phase, process_seconds()))
        self._cpu[phase] = time.process_time()

    def split(self, phase: str, parts: dict[str, float]) -> None:
        """`phase` ended now and is made of `parts` (seconds each, measured inside it, in order); what they leave
        out is "<phase> (rest)"."""
        start = self._ends[-1][1]
        for name, seconds in parts.items():
            start += seconds
            self._ends.append((name, start))
        self.mark(f"{phase} (rest)")

    def table(self) -> list[tuple[str, float, float | None]]:
        """(phase, wall seconds, CPU seconds or None for a part measured inside another) in order; the wall
        seconds add up to the process's age at the last mark."""
        rows: list[tuple[str, float, float | None]] = []
        before, cpu_before = 0.0, 0.0
        for name, end in self._ends:
            cpu = self._cpu.get(name)
            rows.append((name, max(0.0, end - before), None if cpu is None else cpu - cpu_before))
            before, cpu_before = max(before, end), cpu_before if cpu is None else cpu
        return rows

    def print(self, file: TextIO = sys.stderr) -> None:
        for name, seconds, cpu in [*self.table(), ("total", self._ends[-1][1], time.process_time())]:
            print(f"{TIMING_LINE} {name} {seconds:.3f}s" + ("" if cpu is None else f" {cpu:.3f}s cpu"), file=file)
