"""Ctrl-C for the `vidloom` command: at any moment one `cancelled ...` line, no output file, exit status 130.

Standard library only: `main` installs the guard before it imports torch, transformers or a model, so a
Ctrl-C during those imports is ours too (Python's default handler would print a traceback from whatever
import it hit, and library code that swallows the KeyboardInterrupt would let the run go on to write
its file).

The rules, whatever the moment:
- The first Ctrl-C during a generation cancels it through its token: it stops at the next step boundary
  and the command reports the step. Elsewhere (imports, load, encoding) it raises KeyboardInterrupt in
  the main thread, so the command stops where it is; a file being encoded is a temp file that the
  atomic writer removes.
- While torch imports (`held()`), a Ctrl-C is counted and raised when the import ends: raised inside it, the
  exception can cross C++ code of torch's start-up (pybind11) that cannot pass it on, and the process
  aborts (status -6, no line). The import takes a second or two.
- A second Ctrl-C raises KeyboardInterrupt (a step that takes long stops now, not at its end). Once one
  has been raised, later ones are not raised again while it unwinds, so cleanup (`finally` blocks that
  remove temp files) runs to its end.
- Every Ctrl-C is counted even when library code swallows the KeyboardInterrupt: the command calls
  `check()` between its phases and `settle()` after writing, and an interrupted run never keeps a file.
- The output is all or nothing, decided at one point: `settle()` runs inside the writer's clean-up scope,
  right after the last file is renamed into place. A Ctrl-C before it marks the outcome (during an encode,
  or just after the rename) removes the files and exits 130; one after it is ignored (exit 0, the file is
  whole and reported). Exit 130 never leaves a file, exit 0 always does.
- Once the command has settled its outcome (before it prints its last line), SIGINT is ignored for the
  rest of the process: after a success the file is written and reported; after an interruption the
  status stays 130. Python's shutdown puts its own handler back to the default action, which would
  make a Ctrl-C during a slow teardown a kill by signal (status -2 to a parent process, and no line);
  an ignored SIGINT stays ignored, and the normal shutdown still closes worker processes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Any, Iterator, Protocol

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


def say(line: str) -> None:
    """`line` and its newline to stderr in one write: `print` writes them apart, and a Ctrl-C between the two would
    glue the `cancelled` line onto this one."""
    sys.stderr.write(line + "\n")


class Cancellable(Protocol):
    """What the guard cancels on the first Ctrl-C of a generation (runtime.engine.CancellationToken)."""

    @property
    def cancelled(self) -> bool: ...

    def cancel(self) -> None: ...


class InterruptGuard:
    """Owns SIGINT for one `vidloom` command (see the module docstring for the rules)."""

    def __init__(self) -> None:
        self.count = 0  # Ctrl-Cs received so far
        self._token: Cancellable | None = None
        self._raised = False  # a KeyboardInterrupt of ours is unwinding the stack
        self._settled: bool | None = None  # None while running; then whether the command was interrupted
        self._holding = False  # inside held(): count only
        self._previous: Any = None
        self.installed = False

    @classmethod
    def install(cls) -> "InterruptGuard":
        """A guard handling SIGINT from now on; inert outside the main thread, where signals cannot be set."""
        guard = cls()
        if threading.current_thread() is threading.main_thread():
            guard._previous = signal.signal(signal.SIGINT, guard._handle)
            guard.installed = True
        return guard

    @property
    def interrupted(self) -> bool:
        return self.count > 0

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self._settled is not None or self._holding:
            return
        token = self._token
        if token is not None and not token.cancelled:
            token.cancel()  # stops at the next step boundary, with the step it reached
            return
        if not self._raised:
            self._raised = True
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt if a Ctrl-C came, even one whose exception something swallowed."""
        if self.count:
            self._raised = True
            raise KeyboardInterrupt

    @contextmanager
    def cancels(self, token: Cancellable) -> Iterator[None]:
        """While inside, the first Ctrl-C cancels `token` instead of raising."""
        self._token = token
        try:
            yield
        finally:
            self._token = None

    @contextmanager
    def held(self) -> Iterator[None]:
        """While inside, a Ctrl-C is only counted; at the exit it raises KeyboardInterrupt (see the docstring)."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        self.check()

    def forgive(self) -> None:
        """The Ctrl-Cs so far ended the command the way it is meant to end (they stopped a running server):
        not an interruption, so no `cancelled` line and exit status 0."""
        self.count = 0
        self._raised = False

    def settle(self) -> bool:
        """Fix the outcome: True if the command was interrupted at any point. SIGINT is ignored from here on."""
        if self._settled is None:
            self._settled = False  # from here the handler neither raises nor cancels, it only counts
            if self.installed:
                # CPython runs a Ctrl-C still pending in the main thread before it swaps handlers: counted.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            self._settled = self.count > 0
        return self._settled

    def exit_if_interrupted(self) -> None:
        """An atexit handler, registered before torch is imported so that it runs last: an interrupted
        command ends here with 130. Left alone, CPython ends some of those runs by killing itself with
        SIGINT (status -2 to a parent, whatever main returned): a KeyboardInterrupt that passed through
        code run by PyRun_* (pybind11's exec, inside torch's imports) leaves a flag that outlives the catch.
        """
        if self._settled:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)

    def restore(self) -> None:
        """Give SIGINT back to the handler it had before install (for callers of main() in-process)."""
        if self.installed:
            signal.signal(signal.SIGINT, self._previous)
            self.installed = False
