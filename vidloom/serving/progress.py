"""Overall job progress from real step counts: every denoise step and decoded latent frame is one unit."""

from __future__ import annotations

from vidloom.core.card import ModelCard
from vidloom.core.request import GenerationRequest


def expected_units(request: GenerationRequest, card: ModelCard) -> dict[str, int]:
    """Units per phase before any event arrives, so percent does not jump when decode starts."""
    assert request.num_inference_steps is not None and request.num_frames is not None, "resolve first"
    latent_frames = (request.num_frames - 1) // card.geometry.temporal_factor + 1
    loop = next(iter(card.loops), "denoise")  # the phase a loop's steps report under (Wan: denoise, FAR: rollout)
    return {loop: request.num_inference_steps, "decode": latent_frames}


class ProgressTracker:
    """Counts done/total per phase; `percent` stays below 100 until the caller says the job completed.

    A phase the tracker did not expect is added when its first event arrives, and an
    event's own total replaces the expected one (the run knows best). Such a change never
    moves the percent back: a causal rollout reveals its chunk and prefill phases as it goes.
    """

    def __init__(self, expected: dict[str, int]) -> None:
        self._total = dict(expected)
        self._done = {phase: 0 for phase in expected}
        self.phase: str | None = None
        self.step = 0
        self.total = 0
        self._reached = 0

    def update(self, phase: str, step: int, total: int) -> int:
        """Record `step` of `total` done in `phase`; returns the new overall percent."""
        self._total[phase] = max(total, 1)
        self._done[phase] = min(step, self._total[phase])
        self.phase, self.step, self.total = phase, step, total
        return self.percent

    @property
    def percent(self) -> int:
        total = sum(self._total.values())
        if total:
            self._reached = max(self._reached, min(99, 100 * sum(self._done.values()) // total))
        return self._reached
