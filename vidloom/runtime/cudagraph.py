"""CUDA-graph capture of a loop's step body: static input buffers, one graph per input signature.

A step's call (e.g. the DiT forward plus CFG combine) is captured the first time
it runs with a given signature (tensor shapes/dtypes, which inputs are None) and
replayed afterwards with fresh values copied into the static buffers. Python
floats (guidance scale) become 0-dim float32 device tensors, filled before each
replay, so one graph serves every value; `cfg_combine` multiplies such a tensor in
float32 exactly as eager mode multiplies the float.

Capture runs in thread-local error mode: only the capturing thread (the device worker)
may not make unsafe CUDA calls; the runtime keeps every other device-touching chore
(request clean-up, cache release) on that same worker. A capture that still fails
(an op that cannot be captured, an allocator surprise) turns that signature eager for
the rest of the process, with a warning, instead of failing every request of that shape.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Protocol

import torch

from vidloom.core.errors import DeployError

log = logging.getLogger(__name__)

WARMUP_RUNS = 2  # eager runs on a side stream before capture, as CUDA graph capture requires


class Capture(Protocol):
    """A recorded step: `replay()` recomputes `output` from whatever the static inputs now hold."""

    output: torch.Tensor

    def replay(self) -> None: ...


Capturer = Callable[[Callable[..., torch.Tensor], Mapping[str, Any]], Capture]
"""Records `call(**static)` once; raises if the step cannot be captured."""


@dataclass
class _CudaCapture:
    graph: torch.cuda.CUDAGraph
    output: torch.Tensor

    def replay(self) -> None:
        self.graph.replay()


class CudaGraphCapturer:
    """Captures into CUDA graphs that share one memory pool (one step body's graphs never run at once)."""

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise DeployError(f"CUDA graphs need a CUDA device, got {device}")
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, call: Callable[..., torch.Tensor], static: Mapping[str, Any]) -> Capture:
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
        return _CudaCapture(graph, output)


@dataclass
class _Captured:
    capture: Capture
    inputs: dict[str, Any]  # static buffers (tensors, incl. 0-dim float32 for floats) or fixed values

    def output_clone(self) -> torch.Tensor:
        # The graph's output buffer is overwritten by the next replay: hand out a copy.
        return self.capture.output.clone()


class GraphedStep:
    """Wraps `call(**inputs) -> Tensor`; replays a captured graph for signatures seen before.

    `capturer` defaults to CUDA graphs on `device`; tests pass a stand-in that records
    and replays on CPU with the same static-buffer semantics.
    """

    def __init__(
        self, call: Callable[..., torch.Tensor], device: torch.device, capturer: Capturer | None = None
    ) -> None:
        self.call = call
        self.device = device
        self.capturer = capturer if capturer is not None else CudaGraphCapturer(device)
        self._graphs: dict[Hashable, _Captured] = {}
        self._eager: set[Hashable] = set()  # signatures whose capture failed
        self._lock = threading.Lock()
        self.captures = 0
        self.replays = 0
        self.fallbacks = 0

    def __call__(self, **inputs: Any) -> torch.Tensor:
        key = _signature(inputs)
        with self._lock:  # one replay at a time: the static buffers are shared
            if key in self._eager:
                return self.call(**inputs)
            captured = self._graphs.get(key)
            if captured is None:
                captured = self._try_capture(key, inputs)
                if captured is None:
                    return self.call(**inputs)
            for name, value in inputs.items():
                buffer = captured.inputs[name]
                if isinstance(value, torch.Tensor):
                    buffer.copy_(value)
                elif isinstance(value, float):
                    buffer.fill_(value)  # no host-to-device copy; rounds to float32 like eager's scalar
            captured.capture.replay()
            self.replays += 1
            return captured.output_clone()

    def _try_capture(self, key: Hashable, inputs: Mapping[str, Any]) -> _Captured | None:
        static = {k: self._static(v) for k, v in inputs.items()}
        try:
            capture = self.capturer(self.call, static)
        except Exception as exc:  # noqa: BLE001 - any capture failure means "run this shape eagerly"
            self._eager.add(key)
            self.fallbacks += 1
            log.warning("CUDA graph capture failed for step signature %s; running it eagerly from now on: %s: %s",
                        _describe(key), type(exc).__name__, exc)
            return None
        self.captures += 1
        captured = self._graphs[key] = _Captured(capture, static)
        return captured

    def _static(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, float):
            return torch.tensor(value, dtype=torch.float32, device=self.device)
        return value


class StepGraphs:
    """One GraphedStep per step body (plan.call), created on first use."""

    def __init__(self, device: torch.device, capturer: Capturer | None = None) -> None:
        if device.type != "cuda" and capturer is None:
            raise DeployError(f"cuda_graphs needs a CUDA device; this model is loaded on {device}")
        self.device = device
        self.capturer = capturer if capturer is not None else CudaGraphCapturer(device)
        self._steps: dict[int, GraphedStep] = {}

    def get(self, call: Callable[..., torch.Tensor]) -> GraphedStep:
        key = id(call)
        if key not in self._steps:
            self._steps[key] = GraphedStep(call, self.device, self.capturer)
        return self._steps[key]

    def totals(self) -> dict[str, int]:
        """Captures, replays and eager fallbacks over every step body (benchmarks and logs report them)."""
        steps = list(self._steps.values())
        return {name: sum(getattr(step, name) for step in steps) for name in ("captures", "replays", "fallbacks")}


def _signature(inputs: Mapping[str, Any]) -> Hashable:
    parts: list[Hashable] = []
    for name in sorted(inputs):
        value = inputs[name]
        if isinstance(value, torch.Tensor):
            parts.append((name, tuple(value.shape), value.dtype))
        elif isinstance(value, float):
            parts.append((name, "float"))  # a value that changes per call: a static 0-dim buffer
        elif value is None:
            parts.append((name, None))
        else:  # a fixed object (the network module): captured by identity
            parts.append((name, "object", id(value)))
    return tuple(parts)


def _describe(key: Hashable) -> str:
    """The tensor inputs' shapes, for the log line (`latents=(1, 16, 21, 60, 104)`)."""
    return ", ".join(f"{part[0]}={part[1]}" for part in key if isinstance(part[1], tuple))  # type: ignore[union-attr]
