"""Atomic file writes: a temp file beside the target, renamed over it only when the write succeeds."""

from __future__ import annotations

import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

PARTIAL = ".partial"
"""Marks atomic_path's temp files: `.<stem>.<writer pid>.<random>.partial<suffix>` beside the final path."""


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it over `path` only if the block succeeds.

    A writer that raises removes its temp file; one that is killed leaves it behind, and the
    next atomic write to the same path (or remove_stale_temps on the folder) removes it. The final
    file gets the permissions a plain open() would give (0644 under umask 022), not mkstemp's 0600.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent, path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.{os.getpid()}.", suffix=f"{PARTIAL}{path.suffix}", dir=path.parent)
    # One cleanup from the moment the file exists: a Ctrl-C landing while its mode is set (the instant a watcher
    # first sees the file) must remove it too, not only one landing in the caller's block.
    try:
        try:
            os.fchmod(fd, 0o666 & ~current_umask())
        finally:
            os.close(fd)
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def remove_stale_temps(directory: Path, final: Path | None = None) -> list[Path]:
    """Delete atomic_path temp files in `directory` (only those for `final`, if given) whose writer
    process is gone; returns what was removed. Temps of live writers are left alone."""
    removed = []
    for candidate in Path(directory).glob(".*"):
        match = _TEMP_NAME.match(candidate.name)
        if match is None:
            continue
        if final is not None and (match["stem"], match["suffix"]) != (final.stem, final.suffix):
            continue
        if not _alive(int(match["pid"])):
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


_TEMP_NAME = re.compile(r"^\.(?P<stem>.*)\.(?P<pid>\d+)\.[A-Za-z0-9_]+" + re.escape(PARTIAL) + r"(?P<suffix>(\.[^.]*)?)$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask alone must set it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # no /proc: set and restore (racy only against another umask change)
    os.umask(mask)
    return mask
