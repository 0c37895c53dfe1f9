"""Wait for something another thread (a server, a device worker) does."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(check: Callable[[], bool], timeout: float = 10.0, poll: float = 0.02) -> None:
    """Poll `check` every `poll` seconds until it holds; an AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(poll)
