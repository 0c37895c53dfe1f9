"""What travels between the parent, rank 0 and the other ranks: commands, replies, failures.

Every message is a small frozen dataclass that pickles (multiprocessing queues, and
broadcast_object_list on the command channel). Exceptions never travel as objects:
a rank's failure is described (`RankFailure`) and rebuilt in the parent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vidloom.core.errors import (
    Cancelled, CheckpointError, DeployError, InvalidRequest, NonFiniteOutput, VidloomError, WorkerFailed,
)
from vidloom.core.output import Event
from vidloom.core.request import GenerationRequest


@dataclass(frozen=True)
class StepCommand:
    """Run one unit (a node, or one loop step) of a request on every rank."""

    request: GenerationRequest
    """The request, resolved in the parent (seed and defaults filled), so every rank runs the same one."""
    start: bool
    """True on the request's first unit: each rank builds its RequestRun first."""
    cancel: bool
    """The caller cancelled: every rank raises Cancelled at this same boundary."""


@dataclass(frozen=True)
class CloseCommand:
    """Drop a request that will not be stepped again (finished runs are dropped without one)."""

    request_id: str
    """Which request."""


@dataclass(frozen=True)
class AdapterCommand:
    """Load or unload a LoRA adapter in every rank's own registry, between two request units (so every rank's
    requests see the same adapters). Rank 0 replies with the resident adapters."""

    name: str
    """The adapter's name."""
    path: str | None = None
    """The file to load; None unloads `name`."""
    into: str | None = None
    """The component to load it into instead of the family's default."""
    max_rank: int | None = None
    """The largest LoRA rank accepted (None: any)."""


@dataclass(frozen=True)
class WeightsQuery:
    """Every rank measures the weight bytes it holds (parameters, buffers, sharded slices); rank 0 replies with
    the list by rank, as outputs["weight_bytes"] (operators and tests compare the ranks of a plan)."""


@dataclass(frozen=True)
class Heartbeat:
    """Sent by rank 0 while idle so that peers waiting for a command stay within the collective timeout."""


@dataclass(frozen=True)
class Shutdown:
    """Every rank closes its runs, leaves the process group and exits."""


Command = StepCommand | CloseCommand | AdapterCommand | WeightsQuery | Heartbeat | Shutdown


@dataclass(frozen=True)
class RankFailure:
    """An exception one rank raised, described so that the parent can rebuild it."""

    rank: int
    """The rank that raised."""
    kind: str
    """Exception class name."""
    message: str
    """str(exception) (InvalidRequest: the message without the field)."""
    field: str | None = None
    """InvalidRequest's field, when kind is InvalidRequest."""

    @classmethod
    def of(cls, rank: int, exc: BaseException) -> RankFailure:
        if isinstance(exc, InvalidRequest):
            return cls(rank, "InvalidRequest", exc.message, exc.field)
        return cls(rank, type(exc).__name__, str(exc))

    def same_as(self, other: RankFailure) -> bool:
        """The same exception (ignoring which rank raised it)."""
        return (self.kind, self.message, self.field) == (other.kind, other.message, other.field)

    def to_exception(self) -> VidloomError:
        """The error to raise in the parent: vidloom's own kinds come back as themselves."""
        if self.kind == "InvalidRequest":
            return InvalidRequest(self.field or "request", self.message)
        known = _REBUILT.get(self.kind)
        if known is not None:
            return known(self.message)
        return WorkerFailed(self.rank, f"{self.kind}: {self.message}")


# Errors every rank raises identically (they come from the request, not the rank), rebuilt by class.
_REBUILT: dict[str, type[VidloomError]] = {
    "Cancelled": Cancelled,
    "NonFiniteOutput": NonFiniteOutput,
    "DeployError": DeployError,
    "CheckpointError": CheckpointError,
}


@dataclass(frozen=True)
class StepReply:
    """Rank 0's answer to a StepCommand or CloseCommand, after every rank reported its status."""

    done: bool
    """The request finished with this unit."""
    events: tuple[Event, ...] = ()
    """Events rank 0's run emitted during the unit (progress), in order."""
    outputs: dict[str, Any] | None = None
    """Rank 0's RequestRun.outputs() when done (the decoded video as numpy, metadata)."""
    failure: RankFailure | None = None
    """Why the unit failed, if it did; the request is then dropped on every rank."""
    fatal: bool = False
    """The ranks fell out of step (a rank-specific failure, a collective error, a lockstep
    mismatch): every worker exits after this reply and the pool must be restarted."""


@dataclass(frozen=True)
class Ready:
    """A rank joined the process group and loaded the model."""

    rank: int
    """Which rank."""


@dataclass(frozen=True)
class Fatal:
    """A rank cannot go on (load failed, lost its peers); it exits right after sending this."""

    rank: int
    """Which rank."""
    reason: str
    """What happened, for the WorkerFailed message."""
