"""A captured step's inputs (runtime.cudagraph): the signature that keys its graph, the static copies a replay reads,
and the buffers the graphs of one step body share. The two walks (`signature`, `static_copy`) visit the leaves in
the same order."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Hashable, Mapping, NamedTuple

import torch

from vidloom.core.denoiser import GraphInputs


class SharedInputs:
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


# -- inputs: signature and per-call leaves; static copies. The two walks visit leaves in the same order. --------


class _TensorSig(NamedTuple):
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


_FLOAT = "float"  # a value that changes per call: a static 0-dim float32 buffer


def signature(inputs: Mapping[str, Any], leaves: list[torch.Tensor | float]) -> Hashable:
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


def static_copy(value: Any, buffers: list[torch.Tensor], device: torch.device, shared: SharedInputs) -> Any:
    """`value` with its leaves replaced by static buffers holding them (appended to `buffers` in `_sig`'s order)."""
    if isinstance(value, (torch.Tensor, float)):
        buffers.append(shared.take(len(buffers), value, device))
        return buffers[-1]
    if value is None:
        return None
    if isinstance(value, GraphInputs):
        _, parts = value.graph_split()
        return value.graph_rebuild(tuple(static_copy(part, buffers, device, shared) for part in parts))
    if isinstance(value, (tuple, list)):
        return type(value)(static_copy(v, buffers, device, shared) for v in value)
    if isinstance(value, dict):
        return {k: static_copy(v, buffers, device, shared) for k, v in value.items()}
    if not _is_plain_value(value) and _splits(value):
        return dataclasses.replace(value, **{f: v if _is_plain_value(v) else static_copy(v, buffers, device, shared)
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


def clone_output(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.clone()
    if isinstance(output, (tuple, list)):
        return type(output)(clone_output(v) for v in output)
    if isinstance(output, dict):
        return {k: clone_output(v) for k, v in output.items()}
    return output


def holds(key: Any, obj: Any) -> bool:
    """Whether a signature (nested tuples) holds `obj` itself."""
    if key is obj:
        return True
    return isinstance(key, (tuple, frozenset)) and any(holds(part, obj) for part in key)


def describe(key: Hashable) -> str:
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
