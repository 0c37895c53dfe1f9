"""One rank's side of the lockstep protocol: execute a command, then agree with every other rank.

Rank 0 receives each command from the parent and broadcasts it; every rank executes it on
its own Engine (same request, same seed, same program) and then all-gathers a status.
If every rank succeeded, or every rank failed with the same error (a cancel, a NaN, a bad
request), the pool stays healthy. Anything else (one rank failed alone, a collective timed
out, the debug lockstep record differs) means the ranks may no longer be in step: the reply
is fatal and every rank exits, so the parent restarts the pool rather than trust it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

from vidloom.core.loop import NETWORK, StepPlan
from vidloom.core.output import Event
from vidloom.runtime.engine import Engine, RequestRun
from vidloom.runtime.parallel.comm import ControlChannel
from vidloom.runtime.parallel.messages import (
    AdapterCommand, CloseCommand, Command, Heartbeat, RankFailure, Shutdown, StepCommand, StepReply, WeightsQuery,
)


@dataclass(frozen=True)
class RankStatus:
    """What each rank all-gathers after a command."""

    failure: RankFailure | None
    """What this rank raised, if anything."""
    record: tuple[str, ...] | None
    """The lockstep record of the command (debug mode only)."""


@dataclass
class _Outcome:
    done: bool = False
    outputs: dict[str, Any] | None = None
    failure: RankFailure | None = None


class RankRuntime:
    """This rank's Engine and the requests it holds, keyed by request id."""

    def __init__(self, engine: Engine, control: ControlChannel, check_lockstep: bool = False,
                 weight_bytes: Callable[[], int] | None = None) -> None:
        self.engine = engine
        self.weight_bytes = weight_bytes
        """Measures the weight bytes this rank holds (WeightsQuery); None: not measured (-1)."""
        self.control = control
        self.rank = control.rank
        self.check_lockstep = check_lockstep
        self._runs: dict[str, RequestRun] = {}
        self._events: list[Event] = []
        self._record: list[str] | None = None

    def follow(self) -> bool:
        """Ranks other than 0: run broadcast commands until Shutdown (True) or a fatal reply (False)."""
        while True:
            command = self.control.broadcast()
            if isinstance(command, Shutdown):
                self.close_all()
                return True
            reply = self.execute(command)
            if reply is not None and reply.fatal:
                return False

    def execute(self, command: Command) -> StepReply | None:
        """Run `command` here, then agree with the other ranks; None for commands without a reply."""
        if isinstance(command, (Heartbeat, Shutdown)):
            return None
        self._events = []
        self._record = [] if self.check_lockstep else None
        if isinstance(command, CloseCommand):
            self._drop(command.request_id)
            outcome = _Outcome()
        elif isinstance(command, AdapterCommand):
            outcome = self._adapt(command)
        elif isinstance(command, WeightsQuery):
            held = self.control.all_gather(self.weight_bytes() if self.weight_bytes is not None else -1)
            outcome = _Outcome(done=True, outputs={"weight_bytes": held} if self.rank == 0 else None)
        else:
            outcome = self._step(command)
        status = RankStatus(outcome.failure, tuple(self._record) if self._record is not None else None)
        statuses = self.control.all_gather(status)
        return agree(outcome.done, outcome.outputs, tuple(self._events), statuses)

    def close_all(self) -> None:
        for request_id in list(self._runs):
            self._drop(request_id)

    # -- one unit -----------------------------------------------------------------------

    def _step(self, command: StepCommand) -> _Outcome:
        request_id = command.request.request_id
        self._note(f"step {request_id} start={command.start} cancel={command.cancel}")
        try:
            run = self._start(command) if command.start else self._runs[request_id]
            if command.cancel:
                run.cancel.cancel()
            done = run.step()
            outputs = run.outputs() if done and self.rank == 0 else None
        except Exception as exc:  # reported to every rank below; the request ends everywhere
            self._drop(request_id)
            return _Outcome(failure=RankFailure.of(self.rank, exc))
        self._note(f"done={done}")
        if done:
            self._drop(request_id)
        return _Outcome(done=done, outputs=outputs)

    def _adapt(self, command: AdapterCommand) -> _Outcome:
        """Load or unload an adapter here; rank 0's outputs list the resident ones as (name, file, layers)."""
        self._note(f"adapter {command.name} {'load' if command.path is not None else 'unload'}")
        try:
            registry = self.engine.adapters.registry(self.engine.instance)
            if command.path is None:
                registry.unload(command.name)
            else:
                registry.load(command.name, command.path, command.into, command.max_rank)
        except Exception as exc:  # every rank reads the same file: the same error everywhere is not fatal
            return _Outcome(failure=RankFailure.of(self.rank, exc))
        resident = [(a.name, str(a.path), len(a.layers)) for a in registry.adapters]
        return _Outcome(done=True, outputs={"adapters": resident} if self.rank == 0 else None)

    def _start(self, command: StepCommand) -> RequestRun:
        # Only rank 0 reports events: the parent relays them, and the others' would be duplicates.
        on_event = self._relay if self.rank == 0 else None
        observer = self._observe if self.check_lockstep else None
        run = self.engine.submit(command.request, on_event=on_event, observer=observer)
        self._runs[command.request.request_id] = run
        return run

    def _relay(self, event: Event) -> None:
        self._events.append(event)  # the list of the command being executed now

    def _drop(self, request_id: str) -> None:
        run = self._runs.pop(request_id, None)
        if run is not None:
            run.close()

    # -- lockstep record (debug) --------------------------------------------------------

    def _observe(self, plan: StepPlan) -> None:
        parts = [f"{plan.loop} {plan.index + 1}/{plan.total}"]
        for name in sorted(plan.inputs):
            if name != NETWORK:
                parts.append(f"{name}={_fingerprint(plan.inputs[name])}")
        self._note(" ".join(parts))

    def _note(self, entry: str) -> None:
        if self._record is not None:
            self._record.append(entry)


def agree(
    done: bool, outputs: dict[str, Any] | None, events: tuple[Event, ...], statuses: list[RankStatus]
) -> StepReply:
    """The reply every rank computes from the same statuses (so every rank takes the same decision)."""
    failures = [s.failure for s in statuses if s.failure is not None]
    mismatch = _first_mismatch([s.record for s in statuses])
    if mismatch is not None:
        return StepReply(done=False, events=events, failure=mismatch, fatal=True)
    if not failures:
        return StepReply(done=done, events=events, outputs=outputs)
    first = failures[0]
    # Every rank raised the same error: it came from the request (a cancel, a NaN), not from a rank.
    shared = len(failures) == len(statuses) and all(f.same_as(first) for f in failures)
    return StepReply(done=False, events=events, failure=first, fatal=not shared)


def _first_mismatch(records: list[tuple[str, ...] | None]) -> RankFailure | None:
    """A LockstepError naming the first rank whose record differs from rank 0's, and the entries."""
    reference = records[0]
    for rank, record in enumerate(records[1:], start=1):
        if record == reference:
            continue
        ref, mine = list(reference or ()), list(record or ())
        index = next((i for i, (a, b) in enumerate(zip(ref, mine)) if a != b), min(len(ref), len(mine)))
        theirs = ref[index] if index < len(ref) else "<nothing>"
        ours = mine[index] if index < len(mine) else "<nothing>"
        return RankFailure(
            rank, "LockstepError", f"ranks disagree on the step decision: rank 0 ran [{theirs}], rank {rank} ran [{ours}]"
        )
    return None


def _fingerprint(value: Any) -> str:
    """A short, exact-match identity of a plan input: ranks in lockstep hold bitwise-equal tensors,
    so any divergence changes the float64 sum (a cheap check, not a cryptographic one)."""
    if isinstance(value, torch.Tensor):
        if value.numel() <= 4:  # timesteps and scalars: show the values themselves
            return repr(value.detach().cpu().tolist())
        total = float(value.detach().double().sum())
        digest = hashlib.sha256(total.hex().encode()).hexdigest()[:12]
        return f"{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}:{digest}"
    # A default repr names the object's address, which differs between processes holding equal state (SANA-WM's
    # refiner window).
    return _ADDRESS.sub("", repr(value))


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
