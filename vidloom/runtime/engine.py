"""Sync Engine: runs every request kind (RequestRun, request_run.py) in the caller's thread; warmup, admission."""

from __future__ import annotations

import weakref
from typing import Any, Callable

from vidloom.core.adapters import NO_ADAPTERS, StepAdapters
from vidloom.core.card import ModelCard
from vidloom.core.chat import ChatRequest
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import RequestLimits
from vidloom.core.output import EventCallback
from vidloom.core.program import Program
from vidloom.core.request import GenerationRequest
from vidloom.core.speech import SpeechRequest
from vidloom.media.request_inputs import resolve_request
from vidloom.runtime.admission import MemoryAdmission
from vidloom.runtime.cache_manager import CacheManager
from vidloom.runtime.compile_buckets import CompileBuckets, compile_denoisers
from vidloom.runtime.cudagraph import Capturer, StepGraphs
from vidloom.runtime.memory import load_estimator, release_cached_memory, request_budget
from vidloom.runtime.paged_decode import PagedDecoder, build_decoder, no_chat
from vidloom.runtime.request_run import (  # noqa: F401  (re-exported: callers import them from here)
    CancellationToken,
    PlanObserver,
    RequestRun,
    RunObserver,
)
from vidloom.runtime.run_handle import RunHandle
from vidloom.runtime.speech_run import speech_inputs
from vidloom.runtime.rank_share import RankShare
from vidloom.runtime.step_cache import deployed_policy
from vidloom.runtime.warmup import warmup_request


class EngineDriver:
    """What every sync engine shares (EngineAPI): `submit` of any request kind, cancel by id, `run` and `warmup`.

    Subclasses start a generation (`_start_generation`) and, where they can, a chat or a speech request; the
    defaults here are those of an engine without a paged decoder, caches or estimator (a pool of ranks).
    """

    decoder: PagedDecoder | None = None
    caches: CacheManager | None = None
    estimator: Callable[[Any], int] | None = None
    program: Program | None = None

    def __init__(self, instance: Any) -> None:
        self.instance = instance
        self._runs: weakref.WeakValueDictionary[str, RunHandle] = weakref.WeakValueDictionary()  # started, by id

    @property
    def card(self) -> ModelCard:
        return self.instance.card

    @property
    def compile_misses(self) -> int:
        return 0

    def submit(self, work: Any, on_event: EventCallback | None = None, cancel: CancellationToken | None = None,
               **watch: Any) -> Any:
        """Validate `work` (a GenerationRequest, ChatRequest or SpeechRequest; InvalidRequest naming the field
        before any work) and return its started run, stepped by the caller (`step`, or `finish()`). `watch`: a
        generation's observers (observer: PlanObserver, watch: RunObserver) and `resolved=True` for a request the
        caller resolved against this card already (so it is resolved once on the way in)."""
        if isinstance(work, ChatRequest):
            run = self._start_chat(work, on_event, cancel)
        elif isinstance(work, SpeechRequest):  # speech_inputs: can this model speak here, is the request valid
            run = self._start_speech(work, speech_inputs(self, work), on_event, cancel)
        else:
            run = self._start_generation(work, on_event, cancel, **watch)
        self._runs[run.request.request_id] = run
        return run

    def cancel(self, request_id: str) -> bool:
        """Cancel a started run (from any thread): it stops at its next step boundary. False if unknown or done."""
        run = self._runs.get(request_id)
        if run is None or run.done:
            return False
        run.cancel.cancel()
        return True

    def _start_generation(self, request: GenerationRequest, on_event: EventCallback | None,
                          cancel: CancellationToken | None, **watch: Any) -> Any:
        raise NotImplementedError

    def _start_chat(self, request: ChatRequest, on_event: EventCallback | None,
                    cancel: CancellationToken | None) -> Any:
        raise no_chat(self.card.model_id)

    def _start_speech(self, request: SpeechRequest, inputs: tuple[dict[str, Any], int],
                      on_event: EventCallback | None, cancel: CancellationToken | None) -> Any:
        raise NotImplementedError  # (not reached without a paged decoder: speech_inputs refuses first)

    def release_memory(self) -> None:
        """Nothing cached here to return (Engine returns its device's)."""

    def close(self) -> None:
        """Nothing to stop here (ParallelEngine stops its ranks)."""

    def warmup(self, shapes: tuple[tuple[int, int, int], ...], steps: int = 2) -> None:
        """Run one short request per (height, width, num_frames) so compiled graphs exist before users arrive.

        Card defaults (guidance, sampler) apply, so the warmed graphs are the ones requests use (a card whose
        requests give a first frame gets a gray one: runtime.warmup);
        `warmup_guidances` adds guidance values that change the DiT's batch (batched CFG off).
        """
        for shape in shapes:
            for guidance in self.warmup_guidances():
                self.run(warmup_request(self.card, shape, steps, guidance))

    def warmup_guidances(self) -> tuple[float | None, ...]:
        """Guidance scales to warm each shape with (None: the card's default)."""
        return (None,)

    def run(self, work: Any, on_event: EventCallback | None = None,
            cancel: CancellationToken | None = None) -> dict[str, Any]:
        """Run every active node of `work`'s run; return the program's output slots (runtime.results.result_of
        turns them into the caller's result). Raises Cancelled at a boundary."""
        return self.submit(work, on_event, cancel).finish()


class Engine(EngineDriver):
    """Runs requests over one loaded ModelInstance to completion in the caller's thread."""

    def __init__(self, instance: ModelInstance, program: Program, adapters: StepAdapters = NO_ADAPTERS,
                 capturer: Capturer | None = None, rank_share: RankShare | None = None) -> None:
        """`adapters`: how requests' LoRA adapters are resolved and applied (the builder injects vidloom.lora's);
        `capturer`: what records step bodies under cuda_graphs (default: CUDA graphs; CPU tests pass a stand-in);
        `rank_share`: a parallel rank's part in its requests' step caches (runtime.parallel.worker.rank_engine)."""
        deployed_policy(instance.deploy)  # an unknown policy fails at load, not per request
        super().__init__(instance)
        self.adapters = adapters
        self.program = program
        self.rank_share = rank_share
        # Graphs are per engine (per loaded model), shared by its requests, replayed one at a time.
        self._graphs = StepGraphs(instance.device, capturer) if instance.deploy.cuda_graphs else None
        # One budget for the KV caches of every request this engine runs.
        self.caches = CacheManager(instance.deploy.kv_cache_budget_bytes, instance.deploy.kv_session_ttl_s)
        self.compile_buckets = _compile_buckets(instance) if instance.deploy.compile else None
        # The paged KV pool and batched decode forward of every AR loop (chat, a reasoner), over the same
        # resident modules, when the program declares a chat loop.
        self.decoder = build_decoder(instance, program, self.caches, self._graphs)
        # Estimated peak bytes of a resolved request beyond the weights (None: the card gives no estimator).
        self.estimator = load_estimator(instance)
        # What the device had free once the weights (and the KV pool, above) were allocated: one request
        # alone over it fails with LimitExceeded before it allocates anything; the resident requests'
        # estimates together stay within it (MemoryAdmission). Every caller goes through both checks.
        # Chats hold their decode working set on the same ledger (PagedDecoder.memory_bytes), so an engine that
        # chats checks it even when its card estimates no generation request.
        measured = self.estimator is not None or self.decoder is not None
        budget = request_budget(instance.device) if measured else None
        self.limits = RequestLimits(max_memory_bytes=budget)
        self.admission = MemoryAdmission(budget)
        if self._graphs is not None:  # what captured graphs keep is on the same ledger (runtime.graph_memory)
            self._graphs.memory.attach(self.admission)

    @property
    def compile_misses(self) -> int:  # type: ignore[override]
        """Requests that ran eagerly because their shape is outside the compiled buckets."""
        return self.compile_buckets.misses if self.compile_buckets is not None else 0

    @property
    def graph_stats(self) -> dict[str, int] | None:
        """CUDA-graph captures, replays and eager fallbacks so far (None without cuda_graphs)."""
        return self._graphs.totals() if self._graphs is not None else None

    @property
    def static_buffer_stats(self) -> dict[str, int] | None:
        """Static buffers (a causal rollout's KV slabs under cuda_graphs): idle now, taken over by a later
        request, built, dropped for room (runtime.static_buffers); None without cuda_graphs."""
        return self._graphs.buffers.stats() if self._graphs is not None else None

    def warmup_guidances(self) -> tuple[float | None, ...]:
        # Batched CFG runs batch 2 with guidance and batch 1 without: both are compiled buckets.
        if self.compile_buckets is not None and self.compile_buckets.cfg_batched:
            return (None, 1.0)
        return (None,)

    def release_memory(self) -> None:
        """Return cached device memory to the driver now (call from the thread that runs the steps)."""
        release_cached_memory(self.instance.device)

    def _start_generation(
        self,
        request: GenerationRequest,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
        observer: PlanObserver | None = None,
        watch: RunObserver | None = None,
        resolved: bool = False,
    ) -> RequestRun:
        """Validate `request` (InvalidRequest before any work) and prepare its run; `watch` sees it from inside.
        `resolved`: the caller resolved it against this model's card already (a server, at its boundary)."""
        resolved = request if resolved else resolve_request(request, self.instance.card)
        if self.program.check is not None:
            self.program.check(resolved)
        self.limits.check(resolved, self.estimator)
        compiled = self.compile_buckets.admit(resolved) if self.compile_buckets is not None else True
        nbytes = self.estimator(resolved) if self.estimator is not None else 0
        return RequestRun(
            self.instance, self.program, resolved, on_event, cancel, observer, self._graphs, compiled, self.caches,
            self.admission, nbytes, self.decoder, watch=watch, adapters=self.adapters, rank_share=self.rank_share,
        )

    def _start_chat(
        self, request: ChatRequest, on_event: EventCallback | None = None, cancel: CancellationToken | None = None,
    ) -> RequestRun:
        """Validate and tokenize a chat request (InvalidRequest before any work) and prepare its run: the chat
        loop as a program of its own, stepped like any other request. Its text arrives as TextEvents; its
        KV blocks are reserved when the loop starts (CacheBudgetExceeded then) and return when it ends; its decode
        working set is held on the engine's admission ledger while it is resident, like a generation's estimate."""
        if self.decoder is None:
            raise no_chat(self.instance.card.model_id)
        slots = self.decoder.chat_slots(request)
        return RequestRun(self.instance, self.decoder.program, request, on_event, cancel, caches=self.caches,
                          admission=self.admission, memory_bytes=self.decoder.memory_bytes(slots["chat"]),
                          decoder=self.decoder, slots=slots)

    def _start_speech(self, request: SpeechRequest, inputs: tuple[dict[str, Any], int],
                      on_event: EventCallback | None, cancel: CancellationToken | None) -> RequestRun:
        """The card's speech program as a run of `inputs` (speech_inputs' slots and estimated bytes): its thinker
        KV from the paged pool, its estimated bytes held on the admission ledger while it is resident."""
        slots, nbytes = inputs
        return RequestRun(self.instance, self.program, request, on_event, cancel, caches=self.caches,
                          admission=self.admission, memory_bytes=nbytes, decoder=self.decoder, slots=slots)


def _compile_buckets(instance: ModelInstance) -> CompileBuckets:
    compile_denoisers(instance.components, instance.deploy.compile_backend, instance.card.model_id)
    buckets = CompileBuckets(instance.deploy.warmup_shapes, cfg_batched=instance.deploy.cfg_mode == "batched")
    import torch._dynamo

    # dynamo keeps this many graphs per code object (all blocks share their class's forward) and
    # silently runs eagerly past it: make room for every bucket. A process-wide setting, only raised.
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, buckets.capacity + 1)
    return buckets
