"""Sync Engine and RequestRun: a request's program, advanced one step at a time."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from typing import Any, Callable, Iterator, Mapping, TypeVar

import torch

from vidloom.core.errors import Cancelled
from vidloom.core.instance import ModelInstance
from vidloom.core.loop import Done, StepInterceptor, StepPlan
from vidloom.core.output import ChunkEvent, EventCallback, ProgressEvent, VideoChunk
from vidloom.core.program import Node, Program
from vidloom.core.request import GenerationRequest, resolve_request
from vidloom.media.video import to_uint8
from vidloom.runtime.cache_manager import CacheManager
from vidloom.runtime.cudagraph import StepGraphs
from vidloom.runtime.step_cache import make_step_cache, step_cache_policy


T = TypeVar("T")

PlanObserver = Callable[[StepPlan], None]
"""Sees every loop step's plan just before it runs (the parallel workers' lockstep check)."""


class CancellationToken:
    """Set from any thread; the run honours it at the next step boundary."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


class RequestRun:
    """One validated request moving through a program.

    `step()` runs one unit of work (a component node, or one loop step) and returns
    True once the program is done; the caller decides when to call it, which is
    how the async engine interleaves requests at step boundaries. Per-request state
    (slots, loop state, the step interceptor's caches) lives here and is dropped by `close()`.
    """

    def __init__(
        self,
        instance: ModelInstance,
        program: Program,
        request: GenerationRequest,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
        observer: PlanObserver | None = None,
        graphs: StepGraphs | None = None,
        caches: CacheManager | None = None,
    ) -> None:
        self.request = request
        self.caches = caches or CacheManager()
        self._graphs = graphs
        self.instance = instance
        self.program = program
        self.cancel = cancel or CancellationToken()
        self._on_event = on_event
        self._observer = observer
        self._slots: dict[str, Any] = {"request": request}
        # Built per request (InvalidRequest for a threshold without a deployed cache).
        self._interceptor: StepInterceptor | None = make_step_cache(instance.deploy, request)
        self._units = self._run_units()
        self._outputs: dict[str, Any] | None = None
        self._elapsed = 0.0
        self._mark = 0.0  # when the current step (or the last progress report) began
        self._releases: list[Callable[[], None]] = []  # what running loops hold (see hold)

    @property
    def done(self) -> bool:
        return self._outputs is not None

    def step(self) -> bool:
        """Run the next unit; raises Cancelled at a boundary, or whatever the model raised."""
        if self._outputs is not None:
            return True
        started = self._mark = time.perf_counter()
        try:
            with torch.inference_mode():
                next(self._units)
        except StopIteration:
            pass
        finally:
            self._elapsed += time.perf_counter() - started
        return self._outputs is not None

    def outputs(self) -> dict[str, Any]:
        """The program's output slots plus the resolved request and compute time."""
        assert self._outputs is not None, "run has not finished"
        extra = self._interceptor.report() if self._interceptor is not None else {}
        return {**self._outputs, **extra, "request": self.request, "elapsed_s": self._elapsed}

    def close(self) -> None:
        """Drop every intermediate (latents, embeddings), also after failure or cancel."""
        self._units.close()  # runs the open loop's release path (see _run_node)
        self._release_held(0)
        self._slots.clear()
        if self._interceptor is not None:
            self._interceptor.close()
        if self.instance.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()

    # -- runtime services handed to nodes and loops --------------------------------

    def check_cancelled(self) -> None:
        if self.cancel.cancelled:
            raise Cancelled(f"request {self.request.request_id} was cancelled")

    def execute(self, plan: StepPlan) -> Any:
        """Run one loop step: plainly, or through this request's interceptor (step cache)."""
        if self._observer is not None:
            self._observer(plan)
        if self._interceptor is not None:
            return self._interceptor.execute(plan)
        if self._graphs is not None:
            return self._graphs.get(plan.call)(**plan.inputs)
        return plan.call(**plan.inputs)

    def hold(self, release: Callable[[], None]) -> None:
        """Call `release` when the current loop ends (finish, failure or cancel)."""
        self._releases.append(release)

    def emit(self, chunk: VideoChunk) -> None:
        """Pass a finished chunk to the caller as uint8 frames, the same conversion the final video gets."""
        if self._on_event is not None:
            frames = dataclasses.replace(chunk, frames=to_uint8(chunk.frames))
            self._on_event(ChunkEvent(self.request.request_id, frames, int(self.request.fps or 0)))

    def allocate(self, nbytes: int, build: Callable[[], T]) -> T:
        """A cache buffer accounted to this request, released with the loop that asked for it."""
        handle, buffer = self.caches.allocate(self.request.request_id, nbytes, build)
        self.hold(lambda: self.caches.release(handle))
        return buffer

    def _release_held(self, keep: int) -> None:
        while len(self._releases) > keep:
            self._releases.pop()()

    def progress(self, phase: str, done: int, total: int) -> None:
        now = time.perf_counter()
        seconds, self._mark = now - self._mark, now
        if self._on_event is not None:
            self._on_event(ProgressEvent(self.request.request_id, phase, done, total, seconds))
        self.check_cancelled()

    # -- the program as a sequence of units -----------------------------------------

    def _run_units(self) -> Iterator[None]:
        for node in self.program.active_nodes(self.request):
            self.check_cancelled()
            reads = {name: self._slots[name] for name in node.reads}
            written = yield from self._run_node(node, reads)
            missing = [name for name in node.writes if name not in written]
            assert not missing, f"node {node.name!r} did not write {missing}"
            self._slots.update(written)
        self._outputs = {name: self._slots[name] for name in self.program.outputs}

    def _run_node(self, node: Node, reads: Mapping[str, Any]) -> Iterator[None]:
        if node.loop is None:
            assert node.run is not None
            written = node.run(reads, self)
            yield
            return written
        loop = node.loop
        held = len(self._releases)
        try:
            state = loop.init(reads, self)
            while not isinstance(plan := loop.next(state), Done):
                self.check_cancelled()
                state = loop.advance(state, self.execute(plan))
                self.progress(plan.loop, plan.index + 1, plan.total)
                yield
            return loop.finalize(state)
        finally:
            # Also reached when the run is closed mid-loop (cancel, failure elsewhere).
            self._release_held(held)


class EngineDriver:
    """`run` and `warmup` for any engine whose `start(request, on_event, cancel)` returns a steppable run."""

    def start(
        self,
        request: GenerationRequest,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
    ) -> Any:
        raise NotImplementedError

    def warmup(self, shapes: tuple[tuple[int, int, int], ...], steps: int = 2) -> None:
        """Run one short request per (height, width, num_frames) so compiled graphs exist before users arrive.

        Card defaults (guidance, sampler) apply, so the warmed graphs are the ones requests use.
        """
        for height, width, num_frames in shapes:
            self.run(GenerationRequest(
                prompt="warmup", height=height, width=width, num_frames=num_frames, num_inference_steps=steps, seed=0,
            ))

    def run(
        self,
        request: GenerationRequest,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
    ) -> dict[str, Any]:
        """Run every active node; return the program's output slots. Raises Cancelled at a boundary."""
        run = self.start(request, on_event, cancel)
        try:
            while not run.step():
                pass
            return run.outputs()
        finally:
            run.close()


class Engine(EngineDriver):
    """Runs requests over one loaded ModelInstance to completion in the caller's thread."""

    def __init__(self, instance: ModelInstance, program: Program) -> None:
        step_cache_policy(instance.deploy.step_cache)  # an unknown policy fails at load, not per request
        self.instance = instance
        self.program = program
        # Graphs are per engine (per loaded model), shared by its requests, replayed one at a time.
        self._graphs = StepGraphs(instance.device) if instance.deploy.cuda_graphs else None
        # One budget for the KV caches of every request this engine runs.
        self.caches = CacheManager(instance.deploy.kv_cache_budget_bytes)

    def start(
        self,
        request: GenerationRequest,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
        observer: PlanObserver | None = None,
    ) -> RequestRun:
        """Validate `request` (InvalidRequest before any work) and prepare its run."""
        resolved = resolve_request(request, self.instance.card)
        return RequestRun(self.instance, self.program, resolved, on_event, cancel, observer, self._graphs, self.caches)
