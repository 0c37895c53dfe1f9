"""`vidloom generate`'s progress on the terminal: one bar per phase from the engine's events, and the line a
cancelled run prints."""

from __future__ import annotations

import sys
from typing import Any

from vidloom.core.output import Event, ProgressEvent

AFTER_DENOISE_PHASES = ("decode", "audio")  # progress phases past the last step a Ctrl-C can stop at


class ProgressBars:
    """One tqdm bar per phase, fed by the engine's progress events.

    A bar closes when its last step is done, so its rate covers only its own steps. Phases may
    interleave: a causal rollout (AnyFlow-FAR) reports its steps, each finished chunk ("chunks"),
    each chunk's decode and KV prefill as it goes, so every phase keeps its own line until done.
    """

    def __init__(self) -> None:
        self._bars: dict[str, Any] = {}
        self._loop_phase: str | None = None  # the first phase reported: the loop's steps (denoise, rollout)
        self.last_denoise: tuple[int, int] = (0, 0)  # (steps done, total) of the loop phase, for the cancel line
        self.last_phase: str | None = None  # the phase of the latest event (a decode after the steps, ...)

    def __enter__(self) -> "ProgressBars":
        return self

    def __call__(self, event: Event) -> None:
        from tqdm import tqdm

        if not isinstance(event, ProgressEvent):
            return
        if self._loop_phase is None and event.phase not in AFTER_DENOISE_PHASES and event.total is not None:
            self._loop_phase = event.phase  # the loop's own steps (reasoning is open-ended: not a step count)
        self.last_phase = event.phase
        if event.phase == self._loop_phase:
            self.last_denoise = (event.step, event.total)
        bar = self._bars.get(event.phase)
        if bar is None:
            unit = "chunk" if event.phase == "chunks" else "step"
            bar = self._bars[event.phase] = tqdm(
                total=event.total, desc=event.phase, unit=unit, file=sys.stderr, position=len(self._bars),
            )
        bar.update(event.step - bar.n)
        if event.total is not None and event.step >= event.total:
            bar.close()

    def _close_all(self) -> None:
        for bar in self._bars.values():
            bar.close()

    def __exit__(self, *exc: object) -> None:
        self._close_all()


def cancelled_line(bars: ProgressBars) -> str:
    """What a cancelled run prints: the loop step it stopped at, and the phase when past the last step."""
    step, total = bars.last_denoise
    line = f"cancelled at step {step}/{total}" if total else "cancelled before the first denoise step"
    return f"{line} (during {bars.last_phase})" if bars.last_phase in AFTER_DENOISE_PHASES else line
