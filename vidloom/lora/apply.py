"""The LoRA-aware linear, swapped in from outside the model, and the per-step scope that activates adapters.

Base weights are never touched: `LoRALinear` wraps the original module (an nn.Linear or an FP8Linear) and adds
sum_i scale_i * alpha_i / r_i * B_i(A_i x) for the adapters active in the current step.

Why a context variable and not state on the modules: the modules are shared by every request resident on the
engine, while the adapters are chosen per request. The engine sets the scope around each unit of one request's
work (`RequestRun`: a step, or the loop code between steps, which may call the transformer too) and resets it
when the unit returns; the device worker runs one unit at a time on its thread, so a unit of another request
(interleaved at unit boundaries, never inside one) always runs under its own scope, and a ContextVar is private
to its thread, so nothing leaks between workers either.
A batched forward over several runs (runtime.batching, policy "batch") runs under a rows scope instead
(`lora_rows_scope`): each run's adapters are applied to its own rows of the stacked batch, the way
multi-LoRA LLM servers batch requests with different adapters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.lora.files import LoRALayer


@dataclass(frozen=True)
class ActiveLoRAs:
    """The adapters one request runs with, merged per wrapped linear: key -> ((layer, request scale), ...)."""

    layers: Mapping[str, tuple[tuple[LoRALayer, float], ...]]


@dataclass(frozen=True)
class RowLoRAs:
    """Several runs' adapters in one batched forward: parts[i] = (its adapters or None, first row, end row) of
    the stacked batch of `total` rows. A forward whose batch is k x total (CFG passes stacked as [cond; uncond])
    repeats the layout k times."""

    parts: tuple[tuple[ActiveLoRAs | None, int, int], ...]
    total: int


_ACTIVE: ContextVar[ActiveLoRAs | RowLoRAs | None] = ContextVar("vidloom_active_loras", default=None)


@contextlib.contextmanager
def lora_rows_scope(parts: Sequence[tuple[ActiveLoRAs | None, int]]) -> Iterator[None]:
    """Run the body (one batched forward) with each part's adapters applied to its rows (runtime.batching stacks
    the runs' samples in this order)."""
    spans, start = [], 0
    for active, rows in parts:
        spans.append((active, start, start + rows))
        start += rows
    token = _ACTIVE.set(RowLoRAs(tuple(spans), start) if any(a is not None for a, _, _ in spans) else None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def lora_scope(active: ActiveLoRAs | None) -> Iterator[None]:
    """Run the body (one step) with `active` applied by every LoRALinear; None: base weights only."""
    token = _ACTIVE.set(active)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def current_loras() -> ActiveLoRAs | None:
    """The adapters of the one-run scope the caller runs in (None: base weights; never a batched forward's rows,
    which only LoRALinear reads)."""
    active = _ACTIVE.get()
    return active if isinstance(active, ActiveLoRAs) else None


def adapters_active() -> bool:
    """Whether the caller runs under any adapter (a run's scope, or a batched forward's rows that adapt some row):
    a cache of a module's outputs that does not key by the adapters may serve only callers where this is False."""
    return _ACTIVE.get() is not None


def with_adapter(active: ActiveLoRAs | None, adapter: Mapping[str, LoRALayer], scale: float = 1.0) -> ActiveLoRAs:
    """`active` plus one more adapter's layers at `scale`, applied after the ones already there (a program
    stage that always runs with a fixed adapter, on top of what the request chose)."""
    merged = {key: list(entries) for key, entries in (active.layers.items() if active is not None else ())}
    for key, layer in adapter.items():
        merged.setdefault(key, []).append((layer, scale))
    return ActiveLoRAs({key: tuple(entries) for key, entries in merged.items()})


def component_loras(active: ActiveLoRAs | None, component: str) -> tuple[tuple[str, tuple[tuple[LoRALayer, float], ...]], ...]:
    """The entries of `active` on `component`'s linears, sorted by key (empty: none there). What a cache of that
    component's outputs must key by (vidloom.models.ltx2.text: the prompt cache and the text connectors)."""
    if active is None:
        return ()
    prefix = component + ":"
    return tuple(sorted((key, entries) for key, entries in active.layers.items() if key.startswith(prefix)))


def loras_signature(entries: tuple[tuple[str, tuple[tuple[LoRALayer, float], ...]], ...]) -> str:
    """A cache-key part for `entries` (component_loras): each layer's identity and scale. Identities are only
    unique among live objects, so a cache keyed by this must keep `entries` alive as long as the key."""
    return ";".join(f"{key}=" + ",".join(f"{id(layer):x}*{scale!r}" for layer, scale in pairs) for key, pairs in entries)


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

    def unadapted(self) -> nn.Module | None:
        """`base` when no adapter of the current scope touches this layer (forward is then `base(x)`), else None:
        lets a caller fuse base's matmul with what follows (layers.fused_linear) whenever the wrapper adds
        nothing, so a model with adapters loaded but none active computes the same bits as before loading."""
        active = _ACTIVE.get()
        if isinstance(active, RowLoRAs):
            touched = any(part is not None and _live(part.layers.get(self.key, ())) for part, _, _ in active.parts)
        else:
            touched = active is not None and bool(_live(active.layers.get(self.key, ())))
        return None if touched else self.base

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        active = _ACTIVE.get()
        if active is None:
            return y
        if isinstance(active, RowLoRAs):
            return self._rows(x, y, active)
        return _add_updates(x, y, active.layers.get(self.key, ()))

    def _rows(self, x: Tensor, y: Tensor, active: RowLoRAs) -> Tensor:
        """Each part's updates on its rows only (in every repeat of the stacked layout)."""
        repeats, rest = divmod(x.shape[0], active.total)
        if rest or not repeats:
            raise RuntimeError(f"{self.key}: a batch of {x.shape[0]} rows is not a repeat of the {active.total} "
                               "stacked rows the adapters were laid out for")
        spans = [(_live(part.layers.get(self.key, ())) if part is not None else (), start, stop)
                 for part, start, stop in active.parts]
        if not any(entries for entries, _, _ in spans):
            return y  # no run in this batch adapts this layer
        pieces = []
        for r in range(repeats):
            for entries, start, stop in spans:
                lo, hi = r * active.total + start, r * active.total + stop
                pieces.append(_add_updates(x[lo:hi], y[lo:hi], entries) if entries else y[lo:hi])
        return torch.cat(pieces)

    def extra_repr(self) -> str:
        return f"key={self.key!r}"


def _live(entries: tuple[tuple[LoRALayer, float], ...]) -> tuple[tuple[LoRALayer, float], ...]:
    """The entries whose weight is not zero: an adapter at weight 0 adds exact zeros, so it is skipped (and a layer
    with nothing else active runs as its base, fused where layers.fused_linear applies: the base's bits)."""
    return tuple(entry for entry in entries if entry[1] != 0)


def _add_updates(x: Tensor, y: Tensor, entries: tuple[tuple[LoRALayer, float], ...]) -> Tensor:
    # Same order as PEFT's Linear.forward (base, then each adapter's B(A x) * scaling in turn), so
    # mixing matches diffusers' set_adapters to rounding.
    for layer, scale in _live(entries):
        y = y + F.linear(F.linear(x.to(layer.down.dtype), layer.down), layer.up) * (layer.scaling * scale)
    return y


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
