"""InterruptGuard's rules, with real SIGINTs sent to this process (the CLI tests send them to a subprocess)."""

from __future__ import annotations

import signal
import sys
from typing import Iterator

import pytest

from vidloom.cli.interrupt import InterruptGuard, say
from vidloom.runtime.engine import CancellationToken


@pytest.fixture
def guard() -> Iterator[InterruptGuard]:
    before = signal.getsignal(signal.SIGINT)
    installed = InterruptGuard.install()
    assert installed.installed  # pytest runs tests in the main thread
    try:
        yield installed
    finally:
        installed.restore()
        assert signal.getsignal(signal.SIGINT) is before


def test_a_swallowed_ctrl_c_still_stops_the_command_at_its_next_check(guard):
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        pass  # what a library's bare `except:` does to it
    with pytest.raises(KeyboardInterrupt):
        guard.check()
    assert guard.settle() is True


def test_first_ctrl_c_cancels_the_generation_second_raises_once(guard):
    token = CancellationToken()
    with guard.cancels(token):
        signal.raise_signal(signal.SIGINT)  # no exception: the run stops at its next step
        assert token.cancelled and guard.count == 1
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # while that one unwinds (finally blocks removing temp files): counted only
    assert guard.count == 3 and guard.settle() is True


def test_after_the_outcome_is_settled_ctrl_c_changes_nothing(guard):
    guard.check()  # nothing came: no exception
    assert guard.settle() is False
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # survives Python's shutdown, unlike a handler
    signal.raise_signal(signal.SIGINT)
    assert guard.settle() is False


def test_a_note_is_one_write_so_a_ctrl_c_cannot_glue_cancelled_onto_it(monkeypatch):
    """`print(line, file=sys.stderr)` writes the line and its newline apart; a Ctrl-C between them printed
    "...Diffusers.cancelled" as one line (seen in test_ctrl_c_as_the_model_loads)."""
    writes: list[str] = []

    class Stderr:
        def write(self, text: str) -> int:
            if writes:  # a second write: the signal lands here
                raise KeyboardInterrupt
            writes.append(text)
            return len(text)

    monkeypatch.setattr(sys, "stderr", Stderr())
    say("note: the demo has random weights")
    assert writes == ["note: the demo has random weights\n"]


def test_a_ctrl_c_while_held_is_raised_when_the_hold_ends(guard):
    """Around torch's import: raised inside it, a KeyboardInterrupt can cross pybind11 code that cannot pass it on,
    and the process aborts (status -6, seen in CI in test_ctrl_c_while_python_imports_and_loads[0.5])."""
    reached = False
    with pytest.raises(KeyboardInterrupt):
        with guard.held():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            reached = True  # neither signal raised inside
    assert reached and guard.count == 2 and guard.settle() is True


def test_a_hold_without_a_ctrl_c_changes_nothing(guard):
    with guard.held():
        pass
    token = CancellationToken()
    with guard.cancels(token):
        signal.raise_signal(signal.SIGINT)  # after the hold, the first Ctrl-C cancels as before
    assert token.cancelled and guard.settle() is True
