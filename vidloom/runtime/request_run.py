"""RequestRun: one request's program, advanced one step at a time; the cancellation token and observers it takes."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Generator, Iterator, Mapping, Protocol

import torch

from vidloom.core.adapters import NO_ADAPTERS, StepAdapters
from vidloom.core.chat import ChatRequest
from vidloom.core.errors import CacheBudgetExceeded, Cancelled
from vidloom.core.instance import ModelInstance
from vidloom.core.loop import Done, StepInterceptor, StepPlan, is_decode_step
from vidloom.core.output import (
    AudioChunkEvent,
    ChunkEvent,
    EventCallback,
    ProgressEvent,
    TextEvent,
    VideoChunk,
)
from vidloom.core.program import Node, Program
from vidloom.core.request import GenerationRequest
from vidloom.media.uploads import decode_media
from vidloom.layers.tiling import shared_tiles
from vidloom.media.frames import to_uint8
from vidloom.runtime.admission import MemoryAdmission
from vidloom.runtime.cache_manager import CacheManager
from vidloom.runtime.compile_stance import compile_stance
from vidloom.runtime.cudagraph import StepGraphs, capturable
from vidloom.runtime.memory import release_cached_memory, under_pressure
from vidloom.runtime.paged_decode import PagedDecoder
from vidloom.runtime.run_reservations import ReservingRun
from vidloom.runtime.rank_share import RankShare
from vidloom.runtime.step_cache import make_step_cache
from vidloom.runtime.turned_off import alone_reason, conflicts

log = logging.getLogger(__name__)

PlanObserver = Callable[[StepPlan], None]
"""Sees every loop step's plan just before it runs (the parallel workers' lockstep check)."""


class RunObserver(Protocol):
    """Watches a run from inside without changing it (vidloom.parity's taps): each loop step and
    the loop state it leaves, and the slots each program node writes. Called on the stepping thread."""

    def step_started(self, plan: StepPlan) -> None:
        """`plan` is about to run (its network calls follow)."""
        ...

    def step_finished(self, plan: StepPlan, result: Any, state: Any) -> None:
        """`plan` ran and the loop folded `result` into `state`."""
        ...

    def node_finished(self, node: str, written: Mapping[str, Any]) -> None:
        """Program node `node` wrote these slots."""
        ...


class CancellationToken:
    """Set from any thread; the run honours it at the next step boundary."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


class RequestRun(ReservingRun):
    """One validated request (a generation or a chat) moving through a program.

    `step()` runs one unit of work (a component node, or one loop step) and returns
    True once the program is done; the caller decides when to call it, which is
    how the async engine interleaves requests at step boundaries. Per-request state
    (slots, loop state, the step interceptor's caches) lives here and is dropped by `close()`; what it
    reserves (its admission, KV blocks, cache buffers) and the KV wait are ReservingRun's (run_reservations.py).
    """

    def __init__(
        self,
        instance: ModelInstance,
        program: Program,
        request: GenerationRequest | ChatRequest,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
        observer: PlanObserver | None = None,
        graphs: StepGraphs | None = None,
        compiled: bool = True,
        caches: CacheManager | None = None,
        admission: MemoryAdmission | None = None,
        memory_bytes: int = 0,
        decoder: PagedDecoder | None = None,
        slots: Mapping[str, Any] | None = None,
        watch: RunObserver | None = None,
        adapters: StepAdapters = NO_ADAPTERS,
        rank_share: RankShare | None = None,
    ) -> None:
        """`slots`: the program's input slots (default {"request": request}); `decoder`: the engine's paged KV
        pool and decode forward, for loops that reserve KV (chat, a reasoner); `adapters`: how the request's
        LoRA adapters are resolved and applied (injected by the engine's builder)."""
        self.request = request
        super().__init__(admission, memory_bytes, decoder, caches)
        self._graphs = graphs
        self.static = graphs.buffers if graphs is not None else None
        self._compiled = compiled  # False: outside the compiled shape buckets, so never compile for it
        self.instance = instance
        self.program = program
        self.cancel = cancel or CancellationToken()
        self._on_event = on_event
        self._observer = observer
        self._watch = watch
        self.inputs: Mapping[str, Any] = dict(slots) if slots is not None else {"request": request}
        self._slots: dict[str, Any] = dict(self.inputs)
        generating = isinstance(request, GenerationRequest)  # a chat request has no step cache and no adapters
        # Built per request (InvalidRequest for a threshold without a deployed cache).
        self._interceptor: StepInterceptor | None = (
            make_step_cache(instance.deploy, request, instance.card.teacache, rank_share) if generating else None)
        self._tiles = rank_share.tiles if rank_share is not None else None
        # The request's adapters, resolved once: the run holds their tensors, so an unload mid-run cannot pull them.
        # They are in force for everything this run executes (steps, and the loop code between them that calls
        # the transformer too, e.g. a causal loop's text K/V at init), and for nothing another run executes.
        self._adapters = adapters
        self._loras: Any | None = adapters.resolve(instance, request.loras) if generating else None
        uses = dict(step_cache=self._interceptor is not None, graphs=graphs is not None, adapters=self._loras is not None)
        self.disabled: dict[str, str] = {}
        """Deployed features this run runs without, and why (its result's metadata "disabled")."""
        for feature, why in conflicts(instance.deploy, **uses).items():
            self.turn_off(feature, why)
        self._alone = alone_reason(instance.deploy, **uses)
        self._units = self._run_units()
        self._plan: StepPlan | None = None  # yielded by the loop, waiting for its result
        self._outputs: dict[str, Any] | None = None
        self._elapsed = 0.0
        self._mark = 0.0  # when the current step (or the last progress report) began

    def _room_from_static(self) -> bool:
        """Idle static buffers first (ReservingRun); then, on an engine where only captured graphs hold the ledger,
        the graphs (runtime.graph_memory), so that they never keep a request out that fits without them."""
        return super()._room_from_static() or (self._graphs is not None and self._graphs.make_room(self._admission))

    @contextlib.contextmanager
    def _scope(self) -> Iterator[None]:
        """What everything this run executes runs under: inference mode, its compile stance, its adapters, and on
        a parallel rank the peers its tiled decodes share tiles with."""
        with torch.inference_mode(), self._compile_stance(), self._adapters.scope(self._loras), \
                shared_tiles(self._tiles):
            yield

    def step(self) -> bool:
        """Run the next unit; raises Cancelled at a boundary, or whatever the model raised."""
        if self._outputs is not None:
            return True
        if self._plan is None and not self.prepare():
            return self._outputs is not None  # a component node ran (or the program ended)
        plan = self._plan
        assert plan is not None
        started = time.perf_counter()
        try:
            with self._scope():
                result = self.execute(plan)
        finally:
            self._elapsed += time.perf_counter() - started
        self.complete(result)
        return self._outputs is not None

    # -- the step split in three, for a driver that batches plans of several runs ----

    @property
    def pending_plan(self) -> StepPlan | None:
        """The loop step planned and waiting to be executed (None between units)."""
        return self._plan

    @property
    def intercepted(self) -> str | None:
        """Why steps must run alone (None: they may batch): they go through a per-request interceptor (step cache)
        or CUDA graphs, or apply LoRA adapters on compiled blocks (which run them eagerly, under a stance set per
        run). Other runs with adapters batch: the batched forward applies each run's adapters to its own rows
        (`rows_scope`)."""
        return self._alone

    def turn_off(self, feature: str, why: str) -> None:
        """Record, and log once, that this run runs without deployed `feature` (runtime.turned_off)."""
        if feature not in self.disabled:
            self.disabled[feature] = why
            log.info("request %s runs without %s: %s", self.request.request_id, feature, why)

    @property
    def adapter_set(self) -> tuple[tuple[str, float], ...]:
        """The request's adapters (name, scale) as resolved at its start; () for none."""
        return self.request.loras if self._loras is not None else ()

    def rows_scope(self, runs: list[RequestRun], rows: list[int]) -> contextlib.AbstractContextManager[None]:
        """The adapter context of one batched forward over `runs` (this one among them), `rows` samples each."""
        return self._adapters.rows_scope([(run._loras, n) for run, n in zip(runs, rows)])

    def prepare(self) -> bool:
        """Move to the next pause: True when a loop step is planned (nothing ran yet), False when a
        component node ran instead (a whole unit) or the program ended."""
        if self._outputs is not None or self._plan is not None:
            return self._plan is not None
        self._admit_or_fail()
        started = self._mark = time.perf_counter()
        try:
            with self._scope():
                self._plan = next(self._units)
        except StopIteration:
            self._plan = None
        finally:
            self._elapsed += time.perf_counter() - started
        return self._plan is not None

    def complete(self, result: Any, seconds: float = 0.0) -> None:
        """Fold the executed pending plan's `result` into the loop (progress, cancel check); `seconds`
        is compute time spent on it elsewhere (a batched forward's share)."""
        assert self._plan is not None, "no pending plan"
        self._plan = None
        started = time.perf_counter()
        try:
            with self._scope():
                self._units.send(result)
        except StopIteration:
            pass
        finally:
            self._elapsed += time.perf_counter() - started + seconds

    def outputs(self) -> dict[str, Any]:
        """The program's output slots plus the resolved request and compute time."""
        assert self._outputs is not None, "run has not finished"
        extra = self._interceptor.report() if self._interceptor is not None else {}
        if self.disabled:
            extra = {**extra, "disabled": dict(self.disabled)}
        return {**self._outputs, **extra, "request": self.request, "elapsed_s": self._elapsed}

    def close(self) -> None:
        """Drop every intermediate (latents, embeddings), also after failure or cancel.

        The freed blocks stay in the allocator's cache for the next request; they go back to
        the driver only under memory pressure (or `Engine.release_memory()`). Call this on the
        thread that runs the steps (the AsyncEngine's device worker does), never during a capture.
        """
        self._units.close()  # runs the open loop's release path (see _run_node)
        self._release_held(0)
        self._slots.clear()
        self._leave_admission()
        if self._interceptor is not None:
            self._interceptor.close()
        if self._loras is not None:
            self._loras = None  # once: close may run again after a failure
            self._adapters.release(self.instance, self.request.loras)
        if under_pressure(self.instance.device):
            release_cached_memory(self.instance.device)

    def _compile_stance(self) -> contextlib.AbstractContextManager[Any]:
        # torch's stance is process-wide: held through runtime.compile_stance, so steps of engines on other
        # threads that overlap this one cannot leave it set. Adapters run eagerly: the compiled blocks were
        # traced without them.
        if self._loras is not None:
            return compile_stance("force_eager")
        return contextlib.nullcontext() if self._compiled else compile_stance("eager_on_recompile")

    # -- runtime services handed to nodes and loops --------------------------------

    def check_cancelled(self) -> None:
        if self.cancel.cancelled:
            raise Cancelled(f"request {self.request.request_id} was cancelled")

    def execute(self, plan: StepPlan) -> Any:
        """Run one loop step: plainly, or through this request's interceptor (step cache); a paged decode
        step stepped alone goes through the decoder as a batch of one."""
        if self._observer is not None:
            self._observer(plan)
        if is_decode_step(plan):
            assert self.decoder is not None, "a paged decode step without a decoder (reserve_kv refuses that)"
            return self.decoder.run([plan])[0]
        with self._adapters.scope(self._loras):
            if self._interceptor is not None:
                return self._interceptor.execute(plan)
            # A captured graph replays the kernels of its capture, without adapters: steps with them run eagerly.
            if self._graphs is not None and self._loras is None and capturable(plan):
                graphed = self._graphs.get(plan.call)
                result = graphed(**plan.inputs)
                if graphed.last_eager is not None:  # its graph did not fit the memory budget (runtime.graph_memory)
                    self.turn_off("cuda_graphs", graphed.last_eager)
                return result
            return plan.call(**plan.inputs)

    def emit(self, chunk: VideoChunk) -> None:
        """Pass a finished chunk to the caller as uint8 frames, the same conversion the final video gets."""
        if self._on_event is not None:
            frames = dataclasses.replace(chunk, frames=to_uint8(chunk.frames))
            self._on_event(ChunkEvent(self.request.request_id, frames, int(self.request.fps or 0)))

    def emit_audio(self, index: int, start_sample: int, audio: Any, sample_rate: int) -> None:
        """Pass streamed speech samples (float32) to the caller as they are decoded."""
        if self._on_event is not None:
            self._on_event(AudioChunkEvent(self.request.request_id, index, start_sample, audio, sample_rate))

    def emit_text(self, phase: str, text: str, token_ids: tuple[int, ...] = ()) -> None:
        """Pass decoded text (a chat's, a reasoning loop's) and its tokens to the caller as they are written."""
        if self._on_event is not None and (text or token_ids):
            self._on_event(TextEvent(self.request.request_id, phase, text, token_ids))

    @property
    def keeps_sessions(self) -> bool:
        """Whether the deployment keeps a finished request's KV resident (kv_session_ttl_s > 0)."""
        return self.caches.session_ttl_s > 0

    def keep_session(self, nbytes: int, build: Callable[[], Any]) -> bool:
        """Keep `build()` as this request's session (id: the request id) past the run; False when it is not kept
        (sessions off, or no room even after evicting idle ones: the extension then rebuilds it)."""
        if not self.keeps_sessions or self._loras is not None:
            return False  # a KV made under this request's adapters must not serve an extension with other ones
        try:
            self.caches.put_session(self.request.request_id, nbytes, build)
        except CacheBudgetExceeded:
            return False
        return True

    def session(self, session_id: str) -> Any | None:
        """Session `session_id`'s resident buffer, pinned until the loop ends; None when not resident (or when
        this run has adapters: the resident KV was made without them, so the extension rebuilds it under them)."""
        if self._loras is not None:
            return None
        buffer = self.caches.checkout_session(session_id)
        if buffer is not None:
            self.hold(lambda: self.caches.checkin_session(session_id))
        return buffer

    def progress(self, phase: str, done: int, total: int) -> None:
        now = time.perf_counter()
        seconds, self._mark = now - self._mark, now
        if self._on_event is not None:
            self._on_event(ProgressEvent(self.request.request_id, phase, done, total, seconds))
        self.check_cancelled()

    # -- the program as a sequence of units -----------------------------------------

    def _run_units(self) -> Generator[StepPlan | None, Any, None]:
        self._decode_media()
        for node in self.program.active_nodes(self.request):
            self.check_cancelled()
            reads = {name: self._slots[name] for name in node.reads}
            written = yield from self._run_node(node, reads)
            missing = [name for name in node.writes if name not in written]
            assert not missing, f"node {node.name!r} did not write {missing}"
            self._slots.update(written)
            if self._watch is not None:
                self._watch.node_finished(node.name, written)
        self._outputs = {name: self._slots[name] for name in self.program.outputs}

    def _decode_media(self) -> None:
        """Input files were checked from their headers and held compressed while the request waited
        (media.uploads); their pixels are decoded now, on the thread that runs the request. A chat request
        carries no such files (its images are decoded when its prompt is built)."""
        if not isinstance(self.request, GenerationRequest):
            return
        decoded = decode_media(self.request)
        if decoded is not self.request:
            self.request = decoded
            self._slots["request"] = decoded

    def _run_node(self, node: Node, reads: Mapping[str, Any]) -> Generator[StepPlan | None, Any, Mapping[str, Any]]:
        # Pauses: `yield None` after a component node (a unit), `yield plan` for a loop step, which
        # resumes with the step's result (run by `step`, or by a batching driver with other runs').
        if node.loop is None:
            assert node.run is not None
            written = node.run(reads, self)
            yield None
            return written
        loop = node.loop
        held = len(self._releases)
        try:
            state = yield from self._init_loop(loop, reads, held)
            while not isinstance(plan := loop.next(state), Done):
                self.check_cancelled()
                if self._watch is not None:
                    self._watch.step_started(plan)
                result = yield plan
                state = loop.advance(state, result)
                if self._watch is not None:
                    self._watch.step_finished(plan, result, state)
                self.progress(plan.loop, plan.index + 1, plan.total)
                yield None
            return loop.finalize(state)
        finally:
            # Also reached when the run is closed mid-loop (cancel, failure elsewhere).
            self._release_held(held)
