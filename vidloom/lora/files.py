"""Read LoRA adapter files as diffusers' `save_lora_weights` writes them (PEFT keys, optional alpha metadata).

A file holds `<component>.<module>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r] per targeted linear,
and (diffusers >= 0.33) the PEFT LoraConfig under the safetensors metadata key `lora_adapter_metadata`,
packed with the component prefix ("transformer.lora_alpha"). The scaling of each layer is PEFT's:
lora_alpha / r (alpha / sqrt(r) with use_rslora), with rank_pattern / alpha_pattern overriding per module.
Without metadata diffusers takes alpha = r (scaling 1) unless the file carries `<module>.alpha` scalars.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from vidloom.core.errors import CheckpointError, InvalidRequest

METADATA_KEY = "lora_adapter_metadata"  # diffusers.loaders.lora_base.LORA_ADAPTER_METADATA_KEY
_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".alpha")
# LoraConfig options that change the math; a file that turns one on is refused rather than run wrongly.
_REFUSED_OPTIONS = {"use_dora": "DoRA", "lora_bias": "LoRA bias", "fan_in_fan_out": "fan_in_fan_out"}


@dataclass(frozen=True)
class LoRALayer:
    """The low-rank update of one linear: y += scaling * up(down(x))."""

    down: torch.Tensor
    """lora_A [r, in]."""
    up: torch.Tensor
    """lora_B [out, r]."""
    scaling: float
    """PEFT's alpha / r (before the per-request scale)."""


@dataclass(frozen=True)
class LoRAFile:
    """The layers of one adapter file for one component, keyed by the component's checkpoint module names."""

    path: Path
    layers: Mapping[str, LoRALayer]


KeyConverter = Callable[[Path, dict[str, torch.Tensor]], dict[str, torch.Tensor]]
"""A family's community-format reader: (file, its tensors) -> the same tensors under diffusers/PEFT keys
(unchanged when the file already uses them); CheckpointError naming the file and the first key not understood."""


def read_lora_file(path: str | Path, component: str, convert: KeyConverter | None = None,
                   max_rank: int | None = None) -> LoRAFile:
    """Read `path` (in a community format `convert` understands, or diffusers/PEFT keys); CheckpointError names
    the file and the first key not understood."""
    return read_lora_components(path, (component,), convert, max_rank)[component]


def read_lora_components(path: str | Path, components: tuple[str, ...], convert: KeyConverter | None = None,
                         max_rank: int | None = None) -> dict[str, LoRAFile]:
    """Read `path` for each of `components` (a family's LoRA prefixes, such as LTX-2's transformer and
    connectors); a file need not touch every one, but each key must belong to one of them. {component: its
    layers} for the components the file has weights for. `max_rank`: the largest rank accepted (None: any);
    every factor must hold finite floats, every alpha one finite number."""
    path = Path(path)
    try:
        exists = path.is_file()
    except (OSError, ValueError):  # a NUL byte or an over-long name: no file can have it
        exists = False
    if not exists:
        raise CheckpointError(f"{path!s:.200}: no such LoRA file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 -- safe_open is no dict
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors LoRA file ({exc})") from None
    if convert is not None:
        tensors = convert(path, tensors)
    prefixes = tuple(c + "." for c in components)
    for key in tensors:
        if not key.startswith(prefixes):
            expected = " or ".join(f"'{p}<module>.lora_A.weight'" for p in prefixes)
            raise CheckpointError(f"{path}: key {key!r} is not a diffusers/PEFT LoRA key for the "
                                  f"{' / '.join(map(repr, components))} component (expected {expected})")
    files = {}
    for component in components:
        grouped = _group(path, {k: v for k, v in tensors.items() if k.startswith(component + ".")}, component)
        if grouped:
            config = _component_config(path, metadata, component)
            files[component] = LoRAFile(path, {name: _layer(path, f"{component}.{name}", parts, config, max_rank)
                                               for name, parts in grouped.items()})
    if not files:
        raise CheckpointError(f"{path}: no LoRA weights for the {' / '.join(map(repr, components))} component")
    return files


def _component_config(path: Path, metadata: Mapping[str, str], component: str) -> dict[str, Any]:
    raw = metadata.get(METADATA_KEY)
    if raw is None:
        return {}
    try:
        packed = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: metadata {METADATA_KEY!r} is not JSON ({exc})") from None
    if not isinstance(packed, dict):
        raise CheckpointError(f"{path}: metadata {METADATA_KEY!r} must be a JSON object of LoraConfig options, "
                              f"got a JSON {type(packed).__name__}")
    prefix = component + "."
    config = {key[len(prefix):]: value for key, value in packed.items() if key.startswith(prefix)}
    for option, label in _REFUSED_OPTIONS.items():
        if config.get(option):
            raise CheckpointError(f"{path}: {label} adapters ({option}) are not supported")
    return config


def _group(path: Path, tensors: Mapping[str, torch.Tensor], component: str) -> dict[str, dict[str, torch.Tensor]]:
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    prefix = component + "."
    for key, tensor in tensors.items():
        suffix = next((s for s in _SUFFIXES if key.endswith(s)), None)
        if not key.startswith(prefix) or suffix is None:
            raise CheckpointError(
                f"{path}: key {key!r} is not a diffusers/PEFT LoRA key for the {component!r} component "
                f"(expected '{prefix}<module>.lora_A.weight' / '.lora_B.weight')"
            )
        module = key[len(prefix):-len(suffix)]
        grouped.setdefault(module, {})[suffix] = tensor
    return grouped


def _layer(path: Path, module: str, parts: Mapping[str, torch.Tensor], config: Mapping[str, Any],
           max_rank: int | None) -> LoRALayer:
    """One layer's factors and scaling; `module` is "<component>.<module>", as the file's keys and errors say."""
    name = module.partition(".")[2]
    down, up = parts.get(".lora_A.weight"), parts.get(".lora_B.weight")
    if down is None or up is None:
        missing = ".lora_A.weight" if down is None else ".lora_B.weight"
        raise CheckpointError(f"{path}: {name!r} has no {missing!r} (each layer needs lora_A and lora_B)")
    if down.ndim != 2 or up.ndim != 2 or up.shape[1] != down.shape[0]:
        raise CheckpointError(
            f"{path}: {name!r} lora_A {tuple(down.shape)} and lora_B {tuple(up.shape)} are not a rank-r pair "
            f"(lora_B's columns must equal lora_A's rows)"
        )
    rank = down.shape[0]
    if rank < 1:
        raise CheckpointError(f"{path}: {module}.lora_A.weight has rank 0 (no rows); a LoRA layer needs rank >= 1")
    if max_rank is not None and rank > max_rank:
        raise CheckpointError(f"{path}: {module}.lora_A.weight has rank {rank}, over this server's limit "
                              f"max_lora_rank={max_rank}")
    for suffix, factor in ((".lora_A.weight", down), (".lora_B.weight", up)):
        if not factor.is_floating_point() or not bool(torch.isfinite(factor).all()):
            raise CheckpointError(f"{path}: {module}{suffix} must hold finite floating-point values "
                                  f"({factor.dtype}{', with NaN or infinity' if factor.is_floating_point() else ''})")
    where, declared = _pattern_value(path, config, "rank_pattern", name, "r")
    if declared is not None and _number(path, where, declared, whole=True) != rank:
        raise CheckpointError(f"{path}: {name!r} has rank {rank}, the file's metadata declares r={declared}")
    where, alpha = _pattern_value(path, config, "alpha_pattern", name, "lora_alpha")
    if alpha is not None:
        alpha = _number(path, where, alpha)
    elif ".alpha" in parts:
        alpha = _alpha_tensor(path, module + ".alpha", parts[".alpha"])
    else:
        alpha = rank
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return LoRALayer(down=down, up=up, scaling=float(scaling))


def _alpha_tensor(path: Path, key: str, tensor: torch.Tensor) -> float:
    if tensor.numel() != 1 or tensor.is_complex():
        raise CheckpointError(f"{path}: {key} must be one number (a scalar), got a tensor of shape "
                              f"{tuple(tensor.shape)}")
    value = float(tensor.reshape(()))
    if not math.isfinite(value):
        raise CheckpointError(f"{path}: {key} must be a finite number, got {value}")
    return value


def _number(path: Path, key: str, value: Any, whole: bool = False) -> float:
    """A metadata value that must be a finite JSON number (an integer when `whole`)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53
    if isinstance(value, float):
        ok = math.isfinite(value) and (value.is_integer() or not whole)
    if not ok:
        kind = "an integer" if whole else "a finite number"
        raise CheckpointError(f"{path}: metadata {METADATA_KEY!r} {key} must be {kind}, got {str(value)[:40]!r}")
    return int(value) if whole else float(value)


def _pattern_value(path: Path, config: Mapping[str, Any], patterns_key: str, module: str,
                   default_key: str) -> tuple[str, Any]:
    """PEFT's rank_pattern / alpha_pattern lookup: a key (a regex) matches a module name ending in it at a dot
    boundary; else the config's `default_key`. (where the value came from, the value)."""
    patterns = config.get(patterns_key) or {}
    if not isinstance(patterns, dict):
        raise CheckpointError(f"{path}: metadata {METADATA_KEY!r} {patterns_key} must be a JSON object "
                              f"{{module: value}}, got a JSON {type(patterns).__name__}")
    for key, value in patterns.items():
        try:
            matched = re.match(rf"(.*\.)?({key})$", module)
        except (re.error, RecursionError, OverflowError):
            raise CheckpointError(f"{path}: metadata {METADATA_KEY!r} {patterns_key} key {key[:40]!r} is not a "
                                  "regular expression") from None
        if matched:
            return f"{patterns_key}[{key[:40]!r}]", value
    return default_key, config.get(default_key)


def split_scale(text: str, field: str) -> tuple[Path, float]:
    """"PATH[:SCALE]" -> (path, scale); a colon followed by no number is part of the path. InvalidRequest(field)
    for a scale that is not finite."""
    path_text, scale = text, 1.0
    head, sep, tail = text.rpartition(":")
    if sep:
        try:
            scale = float(tail)
        except ValueError:
            pass  # no scale: the colon is part of the path
        else:
            path_text = head
    if not math.isfinite(scale):
        raise InvalidRequest(field, f"{text!r}: the scale must be a finite number")
    return Path(path_text), scale
