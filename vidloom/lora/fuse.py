"""Fused mode: a deployment that always runs one adapter set adds it into the base weights once, at load.

Why: the run-time path (apply.LoRALinear) costs two extra matmuls per targeted linear per step and keeps the
steps with adapters off the batched, compiled and CUDA-graph paths. A server that serves a single style has
no use for per-request choice, so it merges W' = W + sum_i scale_i * alpha_i / r_i * B_i A_i into each targeted
linear (as PEFT's merge / diffusers' `fuse_lora` do) and then runs the plain model: no wrapper, no resident
low-rank weights (the adapter tensors are dropped once added), requests without `loras` on every fast path.

The price is that the set is fixed: requests may not name other adapters, and adapters can no longer be
loaded or unloaded at run time (the registry refuses; the HTTP routes answer 409). Only adapters given at
start can be fused, before the engine warms up or compiles anything, so every graph sees the fused weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.lora.apply import LoRALinear
from vidloom.lora.registry import LORA_SLOT, attach_registry, read_adapter


@dataclass(frozen=True)
class FusedAdapter:
    """One adapter added into the weights at load: its name, file, scale and how many linears it changed."""

    name: str
    path: Path
    scale: float
    layers: int


def fuse_adapters(instance: Any, adapters: Mapping[str, tuple[str | Path, float]]) -> tuple[FusedAdapter, ...]:
    """Add `adapters` ({name: (file, scale)}) into `instance`'s base weights, in order, and mark its registry
    fused (run-time loading refused from then on). DeployError("fuse_loras") when there is nothing to fuse, when
    run-time adapters are already resident, or for a targeted layer that is not a plain floating-point linear
    (FP8 weights: fuse before quantizing is not something a loaded model can do)."""
    if not adapters:
        raise DeployError("fuse_loras: needs the adapters to fuse, given at start (loras / --lora)")
    registry = attach_registry(instance)  # InvalidRequest("lora") for a family without adapters
    if registry.fused:
        raise DeployError(f"fuse_loras: adapters are already fused ({', '.join(f.name for f in registry.fused)})")
    if registry.names:
        raise DeployError(f"fuse_loras: run-time adapters are resident ({', '.join(registry.names)}); fusing is "
                          "only for the adapters given at start")
    components = instance.components
    # Read in float32 whatever the model's dtype: the sum is rounded once, into the weight's dtype, at the end.
    scales = {name: _scale(name, scale) for name, (_, scale) in adapters.items()}  # before reading any file
    read = [(name, read_adapter(name, path, components, instance.card.family, instance.device, torch.float32),
             scales[name]) for name, (path, _) in adapters.items()]
    deltas: dict[str, torch.Tensor] = {}
    for _, adapter, scale in read:
        for key, layer in adapter.layers.items():
            update = (layer.up @ layer.down) * (layer.scaling * scale)
            deltas[key] = deltas[key] + update if key in deltas else update
    targets = {key: _plain_linear(components, key) for key in deltas}  # every layer checked before any is changed
    with torch.no_grad():
        for key, delta in deltas.items():
            weight = targets[key].weight
            weight.copy_((weight.float() + delta.to(weight.device)).to(weight.dtype))  # a held block: host
    fused = tuple(FusedAdapter(name, adapter.path, scale, len(adapter.layers)) for name, adapter, scale in read)
    registry.fused = fused
    return fused


def fused_of(instance: Any) -> tuple[FusedAdapter, ...]:
    """The adapters fused into `instance`'s weights (empty: none, run-time adapters allowed)."""
    registry = instance.components.get(LORA_SLOT)
    return registry.fused if registry is not None else ()


def _scale(name: str, scale: float) -> float:
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale):
        raise InvalidRequest("loras", f"{name!r}: the scale must be a finite number, got {scale!r}")
    return float(scale)


def _plain_linear(components: Mapping[str, Any], key: str) -> nn.Linear:
    component, _, module = key.partition(":")
    target = components[component].get_submodule(module)
    if isinstance(target, LoRALinear):  # wrapped for a program-stage adapter (LTX-2's stage 2): fuse under it
        target = target.base
    weight = getattr(target, "weight", None)
    if not isinstance(target, nn.Linear) or weight is None or not weight.dtype.is_floating_point \
            or weight.element_size() < 2:
        raise DeployError(f"fuse_loras: {component}.{module} is a {type(target).__name__} "
                          f"({getattr(weight, 'dtype', None)}); only plain float linears can take a fused adapter "
                          "(fp8_weights or a GGUF file with fuse_loras is not supported: use run-time adapters)")
    return target
