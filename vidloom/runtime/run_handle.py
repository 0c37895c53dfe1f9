"""What every started request offers its driver: step it, read its outputs, close it.

`RequestRun` (one process) and `ParallelRun` (a pool of ranks) both implement it, so
`Engine.run` and the parallel engine's `run` finish either the same way.
"""

from __future__ import annotations

from typing import Any


class RunHandle:
    """Base of a started request; subclasses define `step`, `outputs` and `close`."""

    kv_wait = False
    """Set by a driver that steps this run among others: a loop that finds its paged KV pool busy waits."""
    waiting_for_kv = False
    """Its next loop waits for paged KV blocks (only a run with paged loops ever does)."""

    _outputs: dict[str, Any] | None = None
    """The finished request's output slots; None until it finished."""

    @property
    def done(self) -> bool:
        return self._outputs is not None

    def admit(self) -> bool:
        """Hold this run's estimated memory on its engine's ledger; False: no room now. A run whose memory is held
        elsewhere (a pool's ranks) is always admitted here."""
        return True

    def step(self) -> bool:
        """Run the next unit of work; True once the request is done."""
        raise NotImplementedError

    def outputs(self) -> dict[str, Any]:
        """The finished request's output slots."""
        raise NotImplementedError

    def close(self) -> None:
        """Drop whatever the request still holds; safe to call more than once."""
        raise NotImplementedError

    def finish(self) -> dict[str, Any]:
        """Step to the end in this thread and return `outputs()`; `close()` runs however it ends."""
        try:
            while not self.step():
                pass
            return self.outputs()
        finally:
            self.close()
