"""CUDA-graph capture of a loop's step body: static input buffers, one graph per input signature.

A step's call (e.g. the DiT forward plus CFG combine) is captured the first time
it runs with a given signature (tensor shapes/dtypes, which inputs are None) and
replayed afterwards with fresh values copied into the static buffers. Python
floats (guidance scale) become 0-dim device tensors so one graph serves every value.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping

import torch

from vidloom.core.errors import DeployError

WARMUP_RUNS = 2  # eager runs on a side stream before capture, as CUDA graph capture requires


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, Any]  # static buffers (tensors) or fixed values (None)
    output: torch.Tensor


class GraphedStep:
    """Wraps `call(**inputs) -> Tensor`; replays a captured graph for signatures seen before."""

    def __init__(self, call: Callable[..., torch.Tensor], device: torch.device) -> None:
        if device.type != "cuda":
            raise DeployError(f"CUDA graphs need a CUDA device, got {device}")
        self.call = call
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()  # graphs of one step share a memory pool
        self._graphs: dict[Hashable, _Captured] = {}
        self._lock = threading.Lock()
        self.captures = 0
        self.replays = 0

    def __call__(self, **inputs: Any) -> torch.Tensor:
        inputs = {k: self._as_tensor(v) for k, v in inputs.items()}
        key = _signature(inputs)
        with self._lock:  # one replay at a time: the static buffers are shared
            captured = self._graphs.get(key)
            if captured is None:
                captured = self._graphs[key] = self._capture(inputs)
                self.captures += 1
            for name, value in inputs.items():
                if isinstance(value, torch.Tensor):
                    captured.inputs[name].copy_(value)
            captured.graph.replay()
            self.replays += 1
            return captured.output.clone()

    def _as_tensor(self, value: Any) -> Any:
        if isinstance(value, float):
            return torch.tensor(value, dtype=torch.float32, device=self.device)
        return value

    def _capture(self, inputs: Mapping[str, Any]) -> _Captured:
        static = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                self.call(**static)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = self.call(**static)
        return _Captured(graph, static, output)


class StepGraphs:
    """One GraphedStep per step body (plan.call), created on first use."""

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise DeployError(f"cuda_graphs needs a CUDA device; this model is loaded on {device}")
        self.device = device
        self._steps: dict[int, GraphedStep] = {}

    def get(self, call: Callable[..., torch.Tensor]) -> GraphedStep:
        key = id(call)
        if key not in self._steps:
            self._steps[key] = GraphedStep(call, self.device)
        return self._steps[key]


def _signature(inputs: Mapping[str, Any]) -> Hashable:
    parts: list[Hashable] = []
    for name in sorted(inputs):
        value = inputs[name]
        if isinstance(value, torch.Tensor):
            parts.append((name, tuple(value.shape), value.dtype))
        elif value is None:
            parts.append((name, None))
        else:  # a fixed object (the network module): captured by identity
            parts.append((name, "object", id(value)))
    return tuple(parts)
