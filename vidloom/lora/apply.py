"""The LoRA-aware linear, swapped in from outside the model, and the per-step scope that activates adapters.

Base weights are never touched: `LoRALinear` wraps the original module (an nn.Linear or an FP8Linear) and adds
sum_i scale_i * alpha_i / r_i * B_i(A_i x) for the adapters active in the current step.

Why a context variable and not state on the modules: the modules are shared by every request resident on the
engine, while the adapters are chosen per request. The engine sets the scope around each unit of one request's
work (`RequestRun`: a step, or the loop code between steps, which may call the transformer too) and resets it
when the unit returns; the device worker runs one unit at a time on its thread, so a unit of another request
(interleaved at unit boundaries, never inside one) always runs under its own scope, and a ContextVar is private
to its thread, so nothing leaks between workers either.
Steps of runs with adapters are never merged into another run's batched forward (they run alone), so the
scope always describes every row of the forward it covers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.lora.files import LoRALayer


@dataclass(frozen=True)
class ActiveLoRAs:
    """The adapters one request runs with, merged per wrapped linear: key -> ((layer, request scale), ...)."""

    layers: Mapping[str, tuple[tuple[LoRALayer, float], ...]]


_ACTIVE: ContextVar[ActiveLoRAs | None] = ContextVar("vidloom_active_loras", default=None)


@contextlib.contextmanager
def lora_scope(active: ActiveLoRAs | None) -> Iterator[None]:
    """Run the body (one step) with `active` applied by every LoRALinear; None: base weights only."""
    token = _ACTIVE.set(active)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def current_loras() -> ActiveLoRAs | None:
    """The adapters of the scope the caller runs in (None: base weights)."""
    return _ACTIVE.get()


def with_adapter(active: ActiveLoRAs | None, adapter: Mapping[str, LoRALayer], scale: float = 1.0) -> ActiveLoRAs:
    """`active` plus one more adapter's layers at `scale`, applied after the ones already there (a program
    stage that always runs with a fixed adapter, on top of what the request chose)."""
    merged = {key: list(entries) for key, entries in (active.layers.items() if active is not None else ())}
    for key, layer in adapter.items():
        merged.setdefault(key, []).append((layer, scale))
    return ActiveLoRAs({key: tuple(entries) for key, entries in merged.items()})


class LoRALinear(nn.Module):
    """base(x) plus the active adapters' low-rank updates for this layer (none outside a scope)."""

    def __init__(self, base: nn.Module, key: str) -> None:
        super().__init__()
        self.base = base
        self.key = key  # "<component>:<module name>", the ActiveLoRAs key
        self.in_features = base.in_features
        self.out_features = base.out_features

    @property
    def weight(self) -> Tensor:
        # Callers that read a linear's weight for its dtype/device (timestep casts) keep working.
        return self.base.weight

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        active = _ACTIVE.get()
        if active is None:
            return y
        # Same order as PEFT's Linear.forward (base, then each adapter's B(A x) * scaling in turn), so
        # mixing matches diffusers' set_adapters to rounding.
        for layer, scale in active.layers.get(self.key, ()):
            y = y + F.linear(F.linear(x.to(layer.down.dtype), layer.down), layer.up) * (layer.scaling * scale)
        return y

    def extra_repr(self) -> str:
        return f"key={self.key!r}"


def wrap_linears(module: nn.Module, component: str, names: list[str]) -> int:
    """Swap each named linear under `module` for a LoRALinear around it (already wrapped ones stay); the count."""
    wrapped = 0
    for name in names:
        target = module.get_submodule(name)
        if isinstance(target, LoRALinear):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, LoRALinear(target, f"{component}:{name}"))
        wrapped += 1
    return wrapped
