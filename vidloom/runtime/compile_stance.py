"""Scoped `torch.compiler` stances that cannot leak: many engines (threads) may hold one at a time.

torch keeps one process-wide stance, and `torch.compiler.set_stance(s)` changes it when the object is
*built* and, on exit, restores whatever it saw then. Used directly per step, that leaks: a stance built
in a `with` line whose later context manager raises is never restored, and two engines whose steps
overlap on two threads exit out of order (A enters force_eager, B enters eager_on_recompile, A exits ->
default, B exits -> force_eager), leaving every later compiled engine in the process eager for good.

So every vidloom step asks for its stance here: the held stances form a set, the strongest one held
(force_eager > eager_on_recompile) is what torch sees, and when the last one goes the stance from before
the first comes back. Stronger wins because a step that asked not to compile (its adapters were not
traced; its shape is outside the buckets) must not compile because another engine's step overlaps it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

STRENGTH = {"eager_on_recompile": 1, "force_eager": 2}
"""The stances a step may hold, weakest first; the strongest held is in force."""


class _Held:
    """The stances held now (one entry per open scope) and the stance from before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[int, str] = {}
        self.before: Any = None  # torch's DynamoStance, captured when the first scope opens
        self.next_token = 0


_HELD = _Held()  # mirrors torch's own process-wide stance, so it is process-wide too


@contextlib.contextmanager
def compile_stance(stance: str) -> Iterator[None]:
    """Hold `stance` ("eager_on_recompile" or "force_eager") for the body; set on entry, released on exit
    whatever the order other holders exit in."""
    if stance not in STRENGTH:
        raise ValueError(f"compile_stance: {stance!r} is not one of {sorted(STRENGTH)}")
    with _HELD.lock:
        token = _HELD.next_token
        _HELD.next_token += 1
        if not _HELD.entries:
            _HELD.before = torch.compiler.set_stance(stance).prev
        _HELD.entries[token] = stance
        _apply()
    try:
        yield
    finally:
        with _HELD.lock:
            del _HELD.entries[token]
            _apply()


def held_stances() -> tuple[str, ...]:
    """The stances held now, in the order their scopes opened (for tests and debugging)."""
    with _HELD.lock:
        return tuple(_HELD.entries.values())


def _apply() -> None:
    # Under _HELD.lock. A fresh set_stance object sets the stance when built; it is never entered or exited.
    if _HELD.entries:
        torch.compiler.set_stance(max(_HELD.entries.values(), key=STRENGTH.__getitem__))
        return
    before = _HELD.before
    _HELD.before = None
    torch.compiler.set_stance(before.stance, skip_guard_eval_unsafe=before.skip_guard_eval_unsafe,
                              force_backend=before.backend)
