"""TaylorSeer: forecast a cached residual from its values at computed steps instead of reusing it as is.

Liu et al. 2025, "From Reusing to Forecasting: Accelerating Diffusion Models with TaylorSeers",
arXiv:2503.06923. The finite differences and the step bookkeeping follow cache-dit's TaylorSeer
calibrator (cache_dit/caching/cache_contexts/calibrators/taylorseer.py, v1.5.3) step by step, so that
DBCache with TaylorSeer takes the same decisions and makes the same frames as cache-dit's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vidloom.core.denoiser import Stream
from vidloom.runtime.cache_stream import map_stream, same_shape

FIRST_DERIVATIVE_STEP = 3
"""cache-dit's state is created at a branch's first computed step (step 0) and counts from -1 there, and it
takes derivatives only once its own counter exceeds 1: from step 3 of the branch on."""


@dataclass
class TaylorSeer:
    """One branch's residual and its finite-difference derivatives at the last computed step."""

    order: int
    born: int
    """The branch step this history started at (its first computed step, or the one after a shape change)."""
    terms: list[Stream] = field(default_factory=list)
    """Y, dY/dt, d2Y/dt2 at the last computed step (as many as could be taken)."""
    last: int = -1
    """The branch step of the last computed step."""

    def update(self, y: Stream, step: int) -> None:
        """Record the residual computed at `step`: each derivative is the change of the one below it since the
        previous computed step, divided by the steps between them (cache-dit: dY_current from dY_prev)."""
        previous, window = self.terms, step - self.last
        terms = [y]
        if previous and not same_shape(previous[0], y):
            previous, self.born = [], step  # a new token count starts a new history
        for i in range(self.order):
            if i >= len(previous) or step - self.born < FIRST_DERIVATIVE_STEP:
                break
            terms.append(map_stream(lambda a, b: (a - b) / window, terms[i], previous[i]))
        self.terms, self.last = terms, step

    def approximate(self, step: int) -> Stream:
        """The Taylor expansion at `step` from the last computed step: sum_i d^iY * elapsed^i / i!."""
        elapsed = step - self.last
        out: Stream | int = 0
        for i, term in enumerate(self.terms):
            scale = 1 / math.factorial(i)
            out = map_stream(lambda acc, t: acc + scale * t * (elapsed**i), out, term) if i else term
        return out  # type: ignore[return-value]
