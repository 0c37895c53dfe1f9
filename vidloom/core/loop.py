"""The Loop protocol: the model owns the loop, the runtime drives it one step at a time.

    state = loop.init(slots)
    while not isinstance(plan := loop.next(state), Done):
        state = loop.advance(state, runtime.execute(plan))
    outputs = loop.finalize(state)

The runtime's driver is vidloom.runtime.engine.RequestRun.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Mapping, Protocol, TypeVar

S = TypeVar("S")


@dataclass(frozen=True)
class Done:
    """Returned by `Loop.next` when the loop has no more steps."""


DONE = Done()


@dataclass(frozen=True)
class StepPlan:
    """One step a loop asks the runtime to run: `call(**inputs)`.

    The loop builds it without running kernels; the runtime executes it, so it can
    observe, intercept (step caches), capture (CUDA graphs) or interleave it.

    `inputs[NETWORK]`, when present, is the network `call` runs (the denoiser), called
    once per CFG branch or once for a stacked batch; interceptors may replace it with a
    view that runs it differently (a step cache skipping blocks) without the loop knowing.
    """

    loop: str  # name of the loop that planned it
    index: int  # 0-based step index
    total: int  # steps the loop will run
    call: Callable[..., Any]
    inputs: Mapping[str, Any] = field(default_factory=dict)
    expert: str | None = None  # which of a model's networks runs this step, when it has several (Wan2.2 A14B)


NETWORK = "network"
"""The StepPlan input key that holds the step's network (see StepPlan)."""


class StepInterceptor(Protocol):
    """Runs one request's loop steps in place of `plan.call(**plan.inputs)`; owns that request's state.

    Built per request by the runtime and dropped with it, so state never lands on
    shared modules and concurrent requests never see each other's.
    """

    def execute(self, plan: StepPlan) -> Any:
        """Run `plan`, returning what `plan.call` would have returned (or a stand-in for it)."""
        ...

    def report(self) -> dict[str, Any]:
        """Metadata entries for the finished run (e.g. {"step_cache": {...}})."""
        ...

    def close(self) -> None:
        """Release held tensors; `report` keeps working."""
        ...


class Loop(Protocol, Generic[S]):
    """Iterative work owned by a model. Per-request state lives in `S`, never on modules."""

    name: str

    def init(self, slots: Mapping[str, Any]) -> S:
        """Build fresh per-request state from the program's slots."""
        ...

    def next(self, state: S) -> StepPlan | Done:
        """Plan the next step (no kernels run here), or Done."""
        ...

    def advance(self, state: S, result: Any) -> S:
        """Fold the result of an executed plan into the state."""
        ...

    def finalize(self, state: S) -> dict[str, Any]:
        """Slot values the loop writes when it is done."""
        ...

