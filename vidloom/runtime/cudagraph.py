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

import dataclasses
import enum
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, NamedTuple, Protocol

import torch

from vidloom.core.denoiser import GraphInputs, StagedDenoiser
from vidloom.core.errors import DeployError
from vidloom.core.loop import NETWORK, StepPlan
from vidloom.runtime.admission import MemoryAdmission
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

    def output_clone(self) -> Any:
        # The graph's output buffers are overwritten by the next replay: hand out copies.
        return _clone(self.capture.output)


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
        self._inputs = _SharedInputs()  # the static input buffers, shared by this body's graphs
        self._lock = threading.Lock()
        self.captures = 0
        self.replays = 0
        self.fallbacks = 0

    def __call__(self, **inputs: Any) -> Any:
        leaves: list[torch.Tensor | float] = []
        key = _signature(inputs, leaves)
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
            return captured.output_clone()

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
        static = {name: _static(inputs[name], buffers, self.device, self._inputs) for name in sorted(inputs)}
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
                        _describe(key), type(exc).__name__, exc)
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
        log.warning("step signature %s: %s", _describe(key), why)
        return None

    def _drop_unused_inputs(self) -> None:
        """Free the static inputs no kept graph reads, and charge what remains."""
        self._inputs.keep(buffer for captured in self._graphs.values() for buffer in captured.buffers)
        self.memory.inputs(self, self._inputs.nbytes)

    def forget(self, obj: Any) -> int:
        """Drop the graphs (and eager marks) whose signature holds `obj` by identity (a static buffer about to be
        freed: runtime.static_buffers), with the static inputs that keep it alive; returns how many."""
        with self._lock:
            stale = [key for key in (*self._graphs, *self._eager, *self._over_budget) if _holds(key, obj)]
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


class _SharedInputs:
    """Static input buffers shared by the graphs of one step body: a graph reads its inputs only during its own
    replay, and every replay first copies all of its inputs in (GraphedStep.__call__, under its lock), so graphs
    whose n-th leaves agree in shape, strides, dtype and device can read the same buffer. A causal rollout captures
    a graph per chunk position, each reading the same prompt K/V: one copy of it instead of one per graph."""

    def __init__(self) -> None:
        self._buffers: dict[Hashable, torch.Tensor] = {}

    def take(self, index: int, value: torch.Tensor | float, device: torch.device) -> torch.Tensor:
        """The buffer of leaf `index` shaped like `value`, holding `value`."""
        if isinstance(value, torch.Tensor):
            key: Hashable = (index, tuple(value.shape), value.stride(), value.dtype, value.device)
        else:
            key = (index, "scalar", device)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = value.clone() if isinstance(value, torch.Tensor) else \
                torch.tensor(value, dtype=torch.float32, device=device)
            self._buffers[key] = buffer
        elif isinstance(value, torch.Tensor):
            buffer.copy_(value)
        else:
            buffer.fill_(value)
        return buffer

    def keep(self, buffers: Any) -> None:
        """Free the buffers no remaining graph reads."""
        used = {id(buffer) for buffer in buffers}
        self._buffers = {key: b for key, b in self._buffers.items() if id(b) in used}

    @property
    def nbytes(self) -> int:
        """What the buffers hold (their ledger charge, runtime.graph_memory)."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def __len__(self) -> int:
        return len(self._buffers)


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


# -- inputs: signature and per-call leaves; static copies. The two walks visit leaves in the same order. --------


class _TensorSig(NamedTuple):
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


_FLOAT = "float"  # a value that changes per call: a static 0-dim float32 buffer


def _signature(inputs: Mapping[str, Any], leaves: list[torch.Tensor | float]) -> Hashable:
    """The graph key of a call's inputs; appends the values to copy into the static buffers to `leaves`."""
    return tuple((name, _sig(inputs[name], leaves)) for name in sorted(inputs))


def _sig(value: Any, leaves: list[torch.Tensor | float]) -> Hashable:
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return _TensorSig(tuple(value.shape), value.dtype, value.device)
    if isinstance(value, float):
        leaves.append(value)
        return _FLOAT
    if value is None:
        return None
    if isinstance(value, GraphInputs):
        fixed, parts = value.graph_split()
        return ("bound", type(value), fixed, tuple(_sig(part, leaves) for part in parts))
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_sig(v, leaves) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, _sig(v, leaves)) for k, v in value.items()))
    if _is_plain_value(value):
        return ("value", value)
    if _splits(value):  # a frozen dataclass holding tensors (a text batch, positions): its fields, one by one
        return ("fields", type(value), tuple((f, ("value", v) if _is_plain_value(v) else _sig(v, leaves))
                                             for f, v in _fields(value)))
    return ("object", id(value))  # a fixed object (the network module): captured by identity


def _static(value: Any, buffers: list[torch.Tensor], device: torch.device, shared: _SharedInputs) -> Any:
    """`value` with its leaves replaced by static buffers holding them (appended to `buffers` in `_sig`'s order)."""
    if isinstance(value, (torch.Tensor, float)):
        buffers.append(shared.take(len(buffers), value, device))
        return buffers[-1]
    if value is None:
        return None
    if isinstance(value, GraphInputs):
        _, parts = value.graph_split()
        return value.graph_rebuild(tuple(_static(part, buffers, device, shared) for part in parts))
    if isinstance(value, (tuple, list)):
        return type(value)(_static(v, buffers, device, shared) for v in value)
    if isinstance(value, dict):
        return {k: _static(v, buffers, device, shared) for k, v in value.items()}
    if not _is_plain_value(value) and _splits(value):
        return dataclasses.replace(value, **{f: v if _is_plain_value(v) else _static(v, buffers, device, shared)
                                             for f, v in _fields(value)})
    return value


def _splits(value: Any) -> bool:
    """A frozen dataclass whose fields can all be set again (dataclasses.replace): split field by field."""
    return (dataclasses.is_dataclass(value) and not isinstance(value, type) and value.__dataclass_params__.frozen
            and all(f.init for f in dataclasses.fields(value)))


def _fields(value: Any) -> list[tuple[str, Any]]:
    return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]


def _is_plain_value(value: Any) -> bool:
    """Compared by value in the signature: numbers, strings, dtypes, and frozen dataclasses / tuples of them."""
    if isinstance(value, (bool, int, float, complex, str, bytes, enum.Enum, torch.dtype, torch.device)):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_is_plain_value(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and value.__dataclass_params__.frozen:
        return all(_is_plain_value(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


def _clone(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.clone()
    if isinstance(output, (tuple, list)):
        return type(output)(_clone(v) for v in output)
    if isinstance(output, dict):
        return {k: _clone(v) for k, v in output.items()}
    return output


def _holds(key: Any, obj: Any) -> bool:
    """Whether a signature (nested tuples) holds `obj` itself."""
    if key is obj:
        return True
    return isinstance(key, (tuple, frozenset)) and any(_holds(part, obj) for part in key)


def _describe(key: Hashable) -> str:
    """The tensor inputs' shapes, for the log line (`latents=(1, 16, 21, 60, 104), network.0=(1, 257, 1280)`)."""
    found: list[str] = []

    def walk(sig: Any, path: str) -> None:
        if isinstance(sig, _TensorSig):
            found.append(f"{path}={sig.shape}")
        elif isinstance(sig, tuple) and sig and sig[0] == "bound":
            for i, part in enumerate(sig[3]):
                walk(part, f"{path}.{i}")
        elif isinstance(sig, tuple) and sig and sig[0] == "fields":
            for name, part in sig[2]:
                walk(part, f"{path}.{name}")
        elif isinstance(sig, tuple) and len(sig) == 2 and sig[0] in (tuple, list, dict):
            for i, part in enumerate(sig[1]):
                walk(part[1] if sig[0] is dict else part, f"{path}.{part[0] if sig[0] is dict else i}")

    for name, sig in key:  # type: ignore[union-attr]
        walk(sig, name)
    return ", ".join(found)
