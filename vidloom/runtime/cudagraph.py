"""CUDA-graph capture of a loop's step body: static input buffers, one graph per input signature.

A step's call (e.g. the DiT forwards plus the guidance combine) is captured the first time it runs with a
given signature and replayed afterwards with fresh values copied into the static buffers. The signature is
the structure of the inputs: each tensor's shape, dtype and device, which inputs are None, the fixed part of
every per-request object that declares `core.denoiser.GraphInputs` (a network view binding the request's
CLIP tokens, positions or camera), plain values (ints, flags, frozen dataclasses of numbers such as LTX-2's
guidance scales) by value, and any other object (a shared module) by identity. Inputs may nest (tuples,
lists, dicts, GraphInputs, and frozen dataclasses holding tensors such as a text batch: their tensor fields
are leaves, their plain fields part of the signature); the step may return a tensor or a tuple/list/dict of
tensors (and None), each handed out as a copy.

The graphs of one step body share their static input buffers where their n-th leaves agree in shape, strides,
dtype and device (a replay copies every input in first): a rollout's graph per chunk position reads one copy of
the prompt K/V.

Python floats (guidance scale) become 0-dim float32 device tensors, filled before each replay, so one graph
serves every value; `cfg_combine` multiplies such a tensor in float32 exactly as eager mode multiplies the
float. Floats inside a plain value (a frozen dataclass) are part of the signature instead: a step may branch
on them.

A step may write in place into a long-lived buffer it also reads (a causal rollout's KV slab: the chunk's K/V, then
attention over the valid prefix) only when that buffer is part of the signature by identity and is the same tensor
at every replay: a static buffer from `StepGraphs.buffers` (runtime.static_buffers), which goes from request to
request of the same shape instead of being freed, so copying it into a static input (hundreds of MB per layer late
in a rollout) is never needed.

Capture runs in thread-local error mode: only the capturing thread (the device worker)
may not make unsafe CUDA calls; the runtime keeps every other device-touching chore
(request clean-up, cache release) on that same worker. A capture that still fails
(an op that cannot be captured, an allocator surprise) turns that signature eager for
the rest of the process, with a warning, instead of failing every request of that shape.

What a graph keeps (its static inputs, its share of the private memory pool) is charged to the engine's request memory
ledger (runtime.graph_memory); a capture that would not fit runs that signature eagerly instead, until room frees.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Protocol

import torch

from vidloom.core.denoiser import StagedDenoiser
from vidloom.core.errors import DeployError
from vidloom.core.loop import NETWORK, StepPlan
from vidloom.runtime.admission import MemoryAdmission
from vidloom.runtime.graph_inputs import SharedInputs, clone_output, describe, holds, signature, static_copy
from vidloom.runtime.graph_memory import GRAPHS_KIND, GraphMemory, pool_growth, pool_reserved
from vidloom.runtime.static_buffers import StaticBuffers

log = logging.getLogger(__name__)

WARMUP_RUNS = 2  # eager runs on a side stream before capture, as CUDA graph capture requires


class Capture(Protocol):
    """A recorded step: `replay()` recomputes `output` (a tensor, or a tuple/list/dict of tensors and None)
    from whatever the static inputs now hold. A capture may say how many bytes it added to its memory pool
    (`pool_bytes`, runtime.graph_memory); one that does not is charged its output buffers."""

    output: Any

    def replay(self) -> None: ...


Capturer = Callable[[Callable[..., Any], Mapping[str, Any]], Capture]
"""Records `call(**static)` once; raises if the step cannot be captured."""


@dataclass
class _CudaCapture:
    graph: torch.cuda.CUDAGraph
    output: Any
    pool_bytes: int  # what the shared pool grew by capturing it

    def replay(self) -> None:
        self.graph.replay()


class CudaGraphCapturer:
    """Captures into CUDA graphs that share one memory pool (one step body's graphs never run at once)."""

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise DeployError(f"CUDA graphs need a CUDA device, got {device}")
        self.device = device
        self.new_pool()

    def new_pool(self) -> None:
        """Capture into a fresh pool from now on (the old one is freed once its last graph is gone)."""
        self.pool = torch.cuda.graph_pool_handle()
        self._pool_bytes = 0  # the pool's segments after its last capture

    def __call__(self, call: Callable[..., Any], static: Mapping[str, Any]) -> Capture:
        home = torch.cuda.current_stream(self.device)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(home)
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                call(**static)
        home.wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: another thread's (legal) CUDA calls do not invalidate this capture;
            # this thread's unsafe calls still fail it, and GraphedStep falls back to eager.
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                output = call(**static)
        except BaseException:
            # When capture_end raises, torch.cuda.graph leaves its capture stream current: put the
            # caller's stream back and drain, so the eager fallback is ordered like any other work.
            torch.cuda.set_stream(home)
            torch.cuda.synchronize(self.device)
            raise
        # Read once per capture, host-side (the allocator's books, no device sync): what the pool reserves now.
        reserved = pool_reserved(self.device, self.pool)
        growth, self._pool_bytes = max(0, reserved - self._pool_bytes), reserved
        return _CudaCapture(graph, output, growth)


@dataclass
class _Captured:
    capture: Capture
    inputs: dict[str, Any]  # the static inputs the capture read (buffers, rebuilt objects, fixed values)
    buffers: list[torch.Tensor]  # the static leaves, in signature order: refilled before each replay

    def outputclone_output(self) -> Any:
        # The graph's output buffers are overwritten by the next replay: hand out copies.
        return clone_output(self.capture.output)


class GraphedStep:
    """Wraps `call(**inputs)`; replays a captured graph for signatures seen before.

    `capturer` defaults to CUDA graphs on `device`; tests pass a stand-in that records
    and replays on CPU with the same static-buffer semantics. `memory`: the ledger entries of the graphs' memory
    (StepGraphs shares one per engine; default: not checked).
    """

    def __init__(self, call: Callable[..., Any], device: torch.device, capturer: Capturer | None = None,
                 memory: GraphMemory | None = None) -> None:
        self.call = call
        self.device = device
        self.capturer = capturer if capturer is not None else CudaGraphCapturer(device)
        self.memory = memory if memory is not None else GraphMemory()
        self._graphs: dict[Hashable, _Captured] = {}
        self._eager: set[Hashable] = set()  # signatures whose capture failed
        # Signatures whose graph did not fit the budget: (why, bytes it lacked), retried once that much is free.
        self._over_budget: dict[Hashable, tuple[str, int]] = {}
        self.last_eager: str | None = None
        """Why the last call ran eagerly for want of memory (None: it replayed, or ran eagerly for another reason)."""
        self._inputs = SharedInputs()  # the static input buffers, shared by this body's graphs
        self._lock = threading.Lock()
        self.captures = 0
        self.replays = 0
        self.fallbacks = 0

    def __call__(self, **inputs: Any) -> Any:
        leaves: list[torch.Tensor | float] = []
        key = signature(inputs, leaves)
        with self._lock:  # one replay at a time: the static buffers are shared
            self.last_eager = None
            if key in self._eager or not self._may_retry(key):
                return self.call(**inputs)
            captured = self._graphs.get(key)
            if captured is None:
                captured = self._try_capture(key, inputs)
                if captured is None:
                    return self.call(**inputs)
            for buffer, value in zip(captured.buffers, leaves, strict=True):
                if isinstance(value, torch.Tensor):
                    buffer.copy_(value)
                else:
                    buffer.fill_(value)  # no host-to-device copy; rounds to float32 like eager's scalar
            captured.capture.replay()
            self.replays += 1
            return captured.outputclone_output()

    def _may_retry(self, key: Hashable) -> bool:
        """False while `key`'s graph did not fit and the budget has not freed what it lacked (sets last_eager)."""
        refused = self._over_budget.get(key)
        if refused is None:
            return True
        free = self.memory.free()
        if free is not None and free < refused[1]:
            self.last_eager = refused[0]
            return False
        del self._over_budget[key]
        return True

    def _try_capture(self, key: Hashable, inputs: Mapping[str, Any]) -> _Captured | None:
        buffers: list[torch.Tensor] = []
        charged = self._inputs.nbytes
        static = {name: static_copy(inputs[name], buffers, self.device, self._inputs) for name in sorted(inputs)}
        added = self._inputs.nbytes - charged
        if not self.memory.inputs(self, self._inputs.nbytes):
            return self._refuse(key, added, "its static inputs")
        try:
            capture = self.capturer(self.call, static)
        except Exception as exc:  # noqa: BLE001 - any capture failure means "run this shape eagerly"
            self._eager.add(key)
            self.fallbacks += 1
            self._drop_unused_inputs()
            log.warning("CUDA graph capture failed for step signature %s; running it eagerly from now on: %s: %s",
                        describe(key), type(exc).__name__, exc)
            return None
        growth = pool_growth(capture)
        if not self.memory.keep(growth):
            del capture
            return self._refuse(key, added + growth, "its static inputs and memory pool")
        self.captures += 1
        captured = self._graphs[key] = _Captured(capture, static, buffers)
        return captured

    def _refuse(self, key: Hashable, needed: int, what: str) -> None:
        """`key`'s graph does not fit: run it eagerly (and say so) until `needed` bytes are free."""
        self._drop_unused_inputs()
        why = self.memory.refusal(needed, what)
        self._over_budget[key] = (why, needed)
        self.last_eager = why
        self.fallbacks += 1
        log.warning("step signature %s: %s", describe(key), why)
        return None

    def _drop_unused_inputs(self) -> None:
        """Free the static inputs no kept graph reads, and charge what remains."""
        self._inputs.keep(buffer for captured in self._graphs.values() for buffer in captured.buffers)
        self.memory.inputs(self, self._inputs.nbytes)

    def forget(self, obj: Any) -> int:
        """Drop the graphs (and eager marks) whose signature holds `obj` by identity (a static buffer about to be
        freed: runtime.static_buffers), with the static inputs that keep it alive; returns how many."""
        with self._lock:
            stale = [key for key in (*self._graphs, *self._eager, *self._over_budget) if holds(key, obj)]
            graphs = sum(self._graphs.pop(key, None) is not None for key in stale)
            for key in stale:
                self._eager.discard(key)
                self._over_budget.pop(key, None)
            self._drop_unused_inputs()
            self.memory.dropped(graphs)
        return len(stale)

    def clear(self) -> int:
        """Drop every graph (and memory refusal) of this step body with its static inputs; returns how many graphs.
        Signatures whose capture failed stay eager."""
        with self._lock:
            graphs = len(self._graphs)
            self._graphs.clear()
            self._over_budget.clear()
            self._drop_unused_inputs()
            self.memory.dropped(graphs)
        return graphs


def capturable(plan: StepPlan) -> bool:
    """Whether a loop step may run from a captured graph: its network declares the staged denoiser contract,
    whose steps are pure (outputs from inputs; no state written in place that later steps read, which a
    replay would write into static copies instead). Other plans (a prefix prefill filling a request's K/V
    buffer, a refiner window, a chunk decode) run eagerly."""
    return isinstance(plan.inputs.get(NETWORK), StagedDenoiser)


class StepGraphs:
    """One GraphedStep per step body (plan.call), created on first use; `buffers`: the static buffers that steps
    write in place (a causal rollout's KV slab), kept across requests so their graphs replay."""

    def __init__(self, device: torch.device, capturer: Capturer | None = None) -> None:
        if device.type != "cuda" and capturer is None:
            raise DeployError(f"cuda_graphs needs a CUDA device; this model is loaded on {device}")
        self.device = device
        self.capturer = capturer if capturer is not None else CudaGraphCapturer(device)
        self._steps: dict[int, GraphedStep] = {}
        self.buffers = StaticBuffers(self.forget)
        # What the graphs keep, on the engine's ledger once it attaches it (Engine: as soon as its budget is measured).
        self.memory = GraphMemory(getattr(self.capturer, "new_pool", None))

    def forget(self, obj: Any) -> int:
        """Drop every step body's graphs recorded over `obj` (StaticBuffers frees it next)."""
        return sum(step.forget(obj) for step in list(self._steps.values()))

    def make_room(self, ledger: MemoryAdmission | None) -> bool:
        """Drop every graph when they are all that holds `ledger` (no run is resident), so that a request the ledger has
        no room for is not kept out forever by graphs alone; False: nothing dropped. While runs are resident their
        end frees room, and dropping graphs a running request replays would only recapture them."""
        if ledger is None or not ledger.in_use or ledger.held_by(GRAPHS_KIND) < ledger.in_use:
            return False
        return sum(step.clear() for step in list(self._steps.values())) > 0

    def get(self, call: Callable[..., Any]) -> GraphedStep:
        key = id(call)
        if key not in self._steps:
            self._steps[key] = GraphedStep(call, self.device, self.capturer, self.memory)
        return self._steps[key]

    def totals(self) -> dict[str, int]:
        """Captures, replays and eager fallbacks over every step body (benchmarks and logs report them)."""
        steps = list(self._steps.values())
        return {name: sum(getattr(step, name) for step in steps) for name in ("captures", "replays", "fallbacks")}
