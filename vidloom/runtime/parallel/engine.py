"""ParallelEngine: the engine interface over a pool of ranks, so VideoGenerator and AsyncEngine drive it unchanged.

`submit` validates in the parent (InvalidRequest before any worker sees the request) and
returns a ParallelRun; each `ParallelRun.step()` is one round trip in which every rank
runs the same unit. Rank 0's progress events are relayed to the caller's `on_event`;
rank 0's outputs (the decoded float video as numpy, metadata) come back at the end.

Failure semantics: a dead worker, a timed-out collective or a lockstep mismatch fails the
running request with WorkerFailed and breaks the pool; the next request restarts it
(weights load again), and `restart()` does the same on demand.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from vidloom.core.adapters import NO_ADAPTERS, StepAdapters
from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import WorkerFailed
from vidloom.core.output import EventCallback
from vidloom.core.parallel import TokenLayout
from vidloom.core.request import GenerationRequest
from vidloom.media.request_inputs import resolve_request
from vidloom.runtime.engine import CancellationToken, EngineDriver
from vidloom.runtime.parallel.messages import CloseCommand, Command, StepCommand, StepReply, WeightsQuery
from vidloom.runtime.parallel.plan import check_request
from vidloom.runtime.parallel.pool_loras import PoolLoRAs
from vidloom.runtime.parallel.worker import LoraSetup
from vidloom.runtime.run_handle import RunHandle
from vidloom.runtime.step_cache import make_step_cache

log = logging.getLogger(__name__)


class Transport(Protocol):
    """How the parent reaches rank 0: a spawned WorkerPool, or rank 0 in this process (torchrun)."""

    epoch: int
    """Bumped by every (re)start; runs from an older epoch no longer exist on the ranks."""
    broken: bool
    """A failure stopped the ranks; `ensure_running` restarts them where that is possible."""

    def call(self, command: Command) -> StepReply: ...

    def ensure_running(self) -> None: ...

    def keep_adapters(self, setup: LoraSetup) -> None:
        """The LoRA adapters a restarted pool loads again."""

    def restart(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class PoolInstance:
    """What the parent knows of the model the ranks hold (the weights live in the workers only)."""

    card: ModelCard
    """The model's card (defaults, geometry) for request validation and output metadata."""
    deploy: DeployConfig
    """The deployment the ranks were started with."""
    device: torch.device
    """Device type of the ranks (each rank has its own device of this type)."""
    checkpoint_dir: str
    """Checkpoint the ranks loaded."""


class ParallelRun(RunHandle):
    """One request on the pool. Same surface as RequestRun: step / outputs / close / finish / cancel / request / done."""

    def __init__(
        self,
        transport: Transport,
        request: GenerationRequest,
        on_event: EventCallback | None,
        cancel: CancellationToken,
    ) -> None:
        self.request = request
        self.cancel = cancel
        self._transport = transport
        self._on_event = on_event
        self._epoch: int | None = None  # set when the first unit reaches the ranks
        self._outputs: dict[str, Any] | None = None
        self._ended = False  # finished, failed or closed: the ranks hold nothing for it

    def step(self) -> bool:
        """Run the next unit on every rank; raises what the ranks raised, or WorkerFailed."""
        if self._outputs is not None:
            return True
        if self._ended:
            raise WorkerFailed(None, f"request {self.request.request_id} already ended")
        start = self._epoch is None
        if start:
            self._transport.ensure_running()  # the automatic restart after a failure
            self._epoch = self._transport.epoch
        elif self._epoch != self._transport.epoch:
            self._ended = True
            raise WorkerFailed(None, "the worker pool restarted since this request began; submit it again")
        try:
            reply = self._transport.call(StepCommand(self.request, start, self.cancel.cancelled))
        except WorkerFailed:
            self._ended = True
            raise
        if self._on_event is not None:
            for event in reply.events:
                self._on_event(event)
        if reply.failure is not None:
            self._ended = True
            if reply.fatal:
                raise WorkerFailed(reply.failure.rank, f"{reply.failure.kind}: {reply.failure.message}")
            raise reply.failure.to_exception()
        if reply.done:
            self._outputs, self._ended = reply.outputs or {}, True
        return reply.done

    def outputs(self) -> dict[str, Any]:
        assert self._outputs is not None, "run has not finished"
        return dict(self._outputs)

    def close(self) -> None:
        """Tell the ranks to drop the request if they still hold it (an abandoned run)."""
        if self._ended or self._epoch is None:
            self._ended = True
            return
        self._ended = True
        if self._epoch != self._transport.epoch or self._transport.broken:
            return
        try:
            self._transport.call(CloseCommand(self.request.request_id))
        except WorkerFailed as exc:  # close must not raise; the pool is already marked broken
            log.warning("closing request %s: %s", self.request.request_id, exc)


class ParallelEngine(EngineDriver):
    """Runs generation requests over a pool of ranks with the engine interface (EngineAPI; submit / run / warmup);
    chat and speech need a paged decoder, which a pool has not (InvalidRequest("model"))."""

    def __init__(self, transport: Transport, instance: PoolInstance, layout: TokenLayout,
                 loras: LoraSetup | None = None, adapters: StepAdapters = NO_ADAPTERS) -> None:
        super().__init__(instance)
        self.transport = transport
        self.layout = layout
        self.lora_registry = PoolLoRAs(instance.card, transport, loras or LoraSetup(), adapters)
        """The ranks' LoRA adapters (load / unload on every rank; what requests may name)."""

    def _start_generation(
        self,
        request: GenerationRequest,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
        resolved: bool = False,
    ) -> ParallelRun:
        """Validate `request` here (InvalidRequest naming the field) and prepare its run; no worker is contacted.
        `resolved`: the caller resolved it against this model's card already."""
        resolved = request if resolved else resolve_request(request, self.instance.card)
        check_request(self.instance.deploy.parallel, self.layout, resolved)
        self.lora_registry.check(resolved.loras)
        make_step_cache(self.instance.deploy, resolved)  # the same threshold checks as one device
        return ParallelRun(self.transport, resolved, on_event, cancel or CancellationToken())

    @property
    def broken(self) -> bool:
        return self.transport.broken

    def weight_bytes(self) -> list[int]:
        """The weight bytes each rank holds, by rank (parameters, buffers and sharded slices of every component:
        runtime.parallel.shard_weights.held_weight_bytes)."""
        self.transport.ensure_running()
        reply = self.transport.call(WeightsQuery())
        if reply.failure is not None:
            raise WorkerFailed(reply.failure.rank, f"{reply.failure.kind}: {reply.failure.message}")
        return list((reply.outputs or {})["weight_bytes"])

    def restart(self) -> None:
        """Start fresh ranks now instead of at the next request."""
        self.transport.restart()

    def close(self) -> None:
        """Stop every rank; also runs at interpreter exit."""
        self.transport.close()
