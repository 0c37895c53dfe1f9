"""The resident adapters of one loaded model: load, unload, and resolve a request's `loras` to weights.

Which components take adapters, and how their diffusers module names map onto ours, each family declares
(Family.lora: the same NameMaps the base weights load through, and its community-format converter). A family
that declares none refuses adapters by name.
"""

from __future__ import annotations

import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vidloom.core.adapters import DEFAULT_MAX_LORAS, check_fused, check_loaded
from vidloom.core.errors import CheckpointError, InvalidRequest
from vidloom.lora.apply import ActiveLoRAs, LoRALinear, wrap_linears
from vidloom.lora.files import LoRAFile, LoRALayer, read_lora_components
from vidloom.registry import families
from vidloom.core.family import Family, LoRASupport

MAX_LORA_NAME_CHARS = 64
"""The longest adapter name: a name is a short identifier requests repeat, and a path segment of its DELETE route."""
LORA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""What an adapter name may hold: letters, digits, `.`, `_`, `-` (no `/`: DELETE /v1/loras/{name} must reach it)."""


def check_lora_name(name: object, field: str = "name") -> str:
    """`name` when it is a valid adapter name; InvalidRequest(field) saying what a name may hold. Checked where
    names come from a server's clients and its config; a local `generate --lora PATH` names an adapter after
    its file's stem, whatever that holds."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_LORA_NAME_CHARS or not LORA_NAME.fullmatch(name):
        shown = repr(name[:40]) + ("..." if len(name) > 40 else "") if isinstance(name, str) else repr(name)
        raise InvalidRequest(field, f"{shown} is not an adapter name: 1 to {MAX_LORA_NAME_CHARS} letters, digits, "
                             "'.', '_' or '-', starting with a letter or digit")
    return name


@dataclass(frozen=True)
class LoadedLoRA:
    """One resident adapter: its file and its layers keyed by LoRALinear key, on the model's device/dtype."""

    name: str
    path: Path
    layers: Mapping[str, LoRALayer]

    @property
    def layer_count(self) -> int:
        """How many linears it adapts."""
        return len(self.layers)


def check_family(family: str, field: str = "loras") -> tuple[Family, LoRASupport]:
    """The declaring family and its LoRA support for card family `family`; InvalidRequest naming `field` for a
    family without adapter support."""
    owner = next((f for f in families() if family in f.card_families), None)
    if owner is None or owner.lora is None:
        supported = sorted(name for f in families() if f.lora is not None for name in f.card_families)
        raise InvalidRequest(
            field, f"LoRA adapters are not supported for the {family!r} family yet (supported: {', '.join(supported)})",
        )
    return owner, owner.lora


class LoRARegistry:
    """Adapters resident on one model instance, at most `max_loras` of them (LRU eviction of idle ones past that).

    A running request resolves its adapters once (`resolve`) and keeps references to their tensors, so
    unloading an adapter never pulls weights from under a step in flight; its memory goes when that run ends.
    """

    def __init__(self, components: Mapping[str, Any], family: str, device: torch.device, dtype: torch.dtype,
                 max_loras: int = DEFAULT_MAX_LORAS) -> None:
        if max_loras < 1:
            raise InvalidRequest("max_loras", f"must be >= 1, got {max_loras}")
        check_family(family, "lora")
        self._family = family
        self._components = components
        self._device, self._dtype = device, dtype
        self.max_loras = max_loras
        self._loaded: OrderedDict[str, LoadedLoRA] = OrderedDict()  # least recently used first
        self._in_use: Counter[str] = Counter()  # name -> runs holding it (resolved, not yet released)
        self.fused: tuple[Any, ...] = ()  # lora.fuse.FusedAdapter of adapters added into the weights at load
        # A server loads and unloads on worker threads while requests resolve on others; module wrapping and
        # the table change under it (a forward sees a linear either wrapped or not: both are the base weights
        # for a run that does not name the new adapter).
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return list(self._loaded)

    @property
    def adapters(self) -> list[LoadedLoRA]:
        return list(self._loaded.values())

    def load(self, name: str, path: str | Path, into: str | None = None, max_rank: int | None = None) -> LoadedLoRA:
        """Read `path` and make it selectable as `name` (replacing an adapter of that name); `into`: the
        component to load it into instead of the family's default (Family.lora.into); `max_rank`: the largest
        rank accepted (None: any)."""
        if not isinstance(name, str) or not name:
            raise InvalidRequest("name", f"must be a non-empty string, got {name!r}")
        self._refuse_if_fused("load")
        with self._lock:
            self._victim(name)  # before reading: a registry full of adapters in use refuses at once
        # Read and cast outside the lock: a large file must not hold up requests resolving their adapters.
        adapter = read_adapter(name, path, self._components, self._family, self._device, self._dtype, into, max_rank)
        with self._lock:
            victim = self._victim(name)
            if victim is not None:
                del self._loaded[victim]
            wrap_adapter(adapter, self._components)
            self._loaded[name] = adapter
        return adapter

    def _victim(self, name: str) -> str | None:
        """The adapter loading `name` evicts: the least recently used one no running request holds (None when
        there is room); InvalidRequest("name") when every resident adapter is in use. Caller holds the lock."""
        if name in self._loaded or len(self._loaded) < self.max_loras:
            return None
        idle = next((n for n in self._loaded if not self._in_use[n]), None)  # _loaded is kept in LRU order
        if idle is None:
            raise InvalidRequest(
                "name", f"cannot load {name!r}: {len(self._loaded)} adapters are resident, the limit max_loras is "
                f"{self.max_loras}, and running requests use all of them ({', '.join(self._loaded)})",
            )
        return idle

    def release(self, names: list[str]) -> None:
        """A run that resolved `names` has ended: they may be evicted again."""
        with self._lock:
            for name in names:
                self._in_use[name] -= 1
                if self._in_use[name] <= 0:
                    del self._in_use[name]

    def _refuse_if_fused(self, what: str) -> None:
        if self.fused:
            raise InvalidRequest("fuse_loras", f"cannot {what} adapters: this deployment fused "
                                 f"{', '.join(f.name for f in self.fused)} into its weights at load (fuse_loras)")

    def unload(self, name: str) -> None:
        self._refuse_if_fused("unload")
        with self._lock:
            if name not in self._loaded:
                raise InvalidRequest("name", f"no LoRA adapter {name!r} is loaded (loaded: {self.names or 'none'})")
            del self._loaded[name]

    def resolve(self, loras: Mapping[str, float]) -> ActiveLoRAs | None:
        """The merged layers a request's {name: scale} runs with; None when it names none."""
        if not loras:
            return None
        merged: dict[str, list[tuple[LoRALayer, float]]] = {}
        with self._lock:
            check_loaded(tuple(loras.items()), list(self._loaded))
            chosen = [(i, name, scale, self._loaded[name]) for i, (name, scale) in enumerate(loras.items())]
            for _, name, _, _ in chosen:  # most recently used last; held until the run releases them
                self._loaded.move_to_end(name)
                self._in_use[name] += 1
        for i, name, scale, adapter in chosen:
            for key, layer in adapter.layers.items():
                merged.setdefault(key, []).append((layer, scale))
        return ActiveLoRAs({key: tuple(entries) for key, entries in merged.items()})

def read_adapter(name: str, path: str | Path, components: Mapping[str, Any], family: str, device: torch.device,
                 dtype: torch.dtype, into: str | None = None, max_rank: int | None = None) -> LoadedLoRA:
    """Read the adapter file `path` for `family`'s LoRA targets among `components` (or into component `into`),
    cast to device/dtype; the modules are not touched (`wrap_adapter` does that)."""
    owner, lora = check_family(family, "lora")
    convert = owner.resolve(lora.converter) if lora.converter is not None else None
    targets = _targets(family, lora, components, into)
    by_prefix: dict[str, list[tuple[str, Any]]] = {}
    for component, prefix, map_target in targets:
        by_prefix.setdefault(prefix, []).append((component, owner.resolve(map_target)))
    files = read_lora_components(Path(path), tuple(by_prefix), convert, max_rank)
    layers: dict[str, LoRALayer] = {}
    for prefix, owners in by_prefix.items():
        if prefix in files:
            layers.update(_place(files[prefix], prefix, [(c, components[c], m) for c, m in owners], device, dtype))
    return LoadedLoRA(name, Path(path), layers)


def _targets(family: str, lora: LoRASupport, components: Mapping[str, Any],
             into: str | None) -> list[tuple[str, str, str]]:
    """(instance component, file prefix, NameMap plug) for each component the adapter goes into; a default
    target the instance lacks (a chat-only folder's generation pathways) is left out."""
    if into is None:
        return [(component, lora.reads.get(component, component), map_target)
                for component, map_target in lora.targets if component in components]
    choices = {c for c, _ in lora.targets} | {c for c in lora.into if c in components}
    if into not in choices:
        raise InvalidRequest("into", f"this {family} model takes adapters into {', '.join(sorted(choices))}, "
                             f"not {into!r}")
    prefix = lora.into.get(into, into)
    return [(into, prefix, dict(lora.targets)[prefix])]


def wrap_adapter(adapter: LoadedLoRA, components: Mapping[str, Any]) -> None:
    """Wrap every linear `adapter` targets in a LoRALinear (once; the base weights stay as they are)."""
    by_component: dict[str, list[str]] = {}
    for key in adapter.layers:
        component, _, module = key.partition(":")
        by_component.setdefault(component, []).append(module)
    for component, names in by_component.items():
        wrap_linears(components[component], component, names)


def _place(file: LoRAFile, prefix: str, owners: list[tuple[str, nn.Module, Any]], device: torch.device,
           dtype: torch.dtype) -> dict[str, LoRALayer]:
    """The file's `prefix` layers, each in the first of `owners` (component, module, NameMap) with the linear its
    map names, keyed by LoRALinear key and checked against that linear."""
    path = file.path
    placed: dict[str, LoRALayer] = {}
    for ckpt_name, layer in file.layers.items():
        for component, module, name_map in owners:
            ours = name_map.to_module(ckpt_name)
            target = _linear(module, ours)
            if target is not None:
                break
        else:
            where = " / ".join(component for component, _, _ in owners)
            raise CheckpointError(f"{path}: LoRA key {prefix}.{ckpt_name!r} matches no linear layer of "
                                  f"the {where} ({owners[0][2].to_module(ckpt_name)!r})")
        if (layer.up.shape[0], layer.down.shape[1]) != (target.out_features, target.in_features):
            raise CheckpointError(
                f"{path}: LoRA {prefix}.{ckpt_name!r} is {layer.down.shape[1]} -> {layer.up.shape[0]}, the "
                f"layer is {target.in_features} -> {target.out_features} (a LoRA for another model?)"
            )
        cast = {"device": device, "dtype": dtype}
        placed[f"{component}:{ours}"] = LoRALayer(layer.down.to(**cast), layer.up.to(**cast), layer.scaling)
    return placed


def _linear(module: nn.Module, name: str) -> nn.Module | None:
    """`module`'s linear `name` (a wrapped one's base), or None."""
    try:
        target = module.get_submodule(name)
    except AttributeError:
        return None
    if isinstance(target, LoRALinear):
        target = target.base
    return target if hasattr(target, "in_features") else None


LORA_SLOT = "lora_adapters"
"""The instance component that holds its LoRARegistry (created by the first `attach_registry`)."""


def attach_registry(instance: Any, max_loras: int | None = None) -> LoRARegistry:
    """The instance's adapter registry, created on first use (InvalidRequest("lora") for a family without
    support). `max_loras` None keeps the current bound (DEFAULT_MAX_LORAS for a new registry)."""
    registry = instance.components.get(LORA_SLOT)
    if registry is None:
        check_lora_card(instance.card)
        registry = LoRARegistry(instance.components, instance.card.family, instance.device, instance.dtype,
                                max_loras if max_loras is not None else DEFAULT_MAX_LORAS)
        instance.components[LORA_SLOT] = registry
    elif max_loras is not None:
        if max_loras < max(1, len(registry.names)):
            raise InvalidRequest("max_loras", f"must be >= 1 and >= the {len(registry.names)} resident adapters, "
                                 f"got {max_loras}")
        registry.max_loras = max_loras
    return registry


def resolve_request_loras(instance: Any, loras: tuple[tuple[str, float], ...]) -> ActiveLoRAs | None:
    """What a run applies for its request's `loras` (validated names and scales); None for none."""
    if not loras:
        return None
    check_family(instance.card.family)
    registry = instance.components.get(LORA_SLOT)
    if registry is None:
        check_loaded(loras, [])  # raises: no adapter is loaded
    if registry.fused:
        check_fused(loras, [(f.name, f.scale) for f in registry.fused])
        return None
    return registry.resolve(dict(loras))


def check_lora_card(card: Any) -> None:
    """InvalidRequest("lora") for a card that takes no adapters (its family declares none, or its capabilities
    refuse them with a reason)."""
    refused = card.capabilities.lora_why_not
    if refused is not None:
        raise InvalidRequest("lora", f"{card.model_id} takes no LoRA adapters: {refused}")
    check_family(card.family, "lora")


def release_request_loras(instance: Any, loras: tuple[tuple[str, float], ...]) -> None:
    """The run that resolved `loras` (resolve_request_loras) has ended: its adapters may be evicted again."""
    registry = instance.components.get(LORA_SLOT)
    if loras and registry is not None and not registry.fused:
        registry.release([name for name, _ in loras])
