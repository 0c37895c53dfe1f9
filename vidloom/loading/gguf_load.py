"""Put a GGUF file's tensors onto a module: Linear weights stay quantized (GGUFLinear), the rest is dequantized.

Quantized Linear weights are swapped in while the module is still on the meta device (`quantize_on_meta`, the
`prepare` step of precision.materialize), so the full-size weights they replace are never allocated. Norms,
embeddings, convolutions and modulation tables that a file stores quantized are dequantized once, at load,
into their plain parameters (they are small, and our models read them as tensors).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from vidloom.core.errors import CheckpointError
from vidloom.layers.gguf_linear import GGUFLinear, install_quantized
from vidloom.layers.quantized_weight import QuantizedWeight
from vidloom.loading.name_map import NameMap

GGUFTensors = Mapping[str, "torch.Tensor | QuantizedWeight"]


def _linear_weight(module: nn.Module, name: str) -> bool:
    owner_name, _, leaf = name.rpartition(".")
    try:
        owner = module.get_submodule(owner_name)
    except AttributeError:
        return False
    return leaf == "weight" and isinstance(owner, (nn.Linear, GGUFLinear))


def quantize_on_meta(tensors: GGUFTensors, name_map: NameMap) -> Callable[[nn.Module], None]:
    """A `prepare` for materialize: every quantized tensor that is a Linear's weight becomes a GGUFLinear."""

    def prepare(module: nn.Module) -> None:
        for key, value in tensors.items():
            name = name_map.to_module(key)
            if isinstance(value, QuantizedWeight) and _linear_weight(module, name):
                install_quantized(module, name, value.to("meta"))

    return prepare


def place_quantized(module: nn.Module, name: str, value: QuantizedWeight, target: torch.Tensor) -> None:
    """Put one quantized tensor onto `module`'s `name` (`target` its current tensor): a Linear's weight stays
    quantized (the Linear becomes a GGUFLinear computing in `target`'s dtype); anything else is dequantized."""
    if _linear_weight(module, name):
        install_quantized(module, name, value, target.dtype)
        return
    with torch.no_grad():
        target.copy_(value.dequantize(torch.float32))


def fill_from_gguf(module: nn.Module, tensors: GGUFTensors, name_map: NameMap, path: Path) -> None:
    """Copy every tensor of the file at `path` (already read, keys in checkpoint naming) into `module`.

    Quantized Linear weights not yet swapped in (a module materialized without `quantize_on_meta`) are
    swapped here. CheckpointError names the file and tensor for an unexpected, missing or mis-shaped one.
    """
    loaded: set[str] = set()
    plain = dict(module.named_parameters())
    plain.update(module.named_buffers())
    for key, value in tensors.items():
        name = name_map.to_module(key)
        if isinstance(value, QuantizedWeight) and _linear_weight(module, name):
            _put_quantized(module, name, value, path, key)
        else:
            _put_plain(plain, module, name, value, path, key)
        loaded.add(name)
    expected = [name.removesuffix(".packed") + ".weight" if name.endswith(".packed") else name
                for name in module.state_dict()]
    missing = [name_map.to_checkpoint(name) for name in expected if name not in loaded]
    if missing:
        shown = ", ".join(repr(k) for k in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"{path}: missing tensors {shown}{more} for {type(module).__name__}")


def _put_quantized(module: nn.Module, name: str, value: QuantizedWeight, path: Path, key: str) -> None:
    owner = module.get_submodule(name.rpartition(".")[0])
    try:
        if not isinstance(owner, GGUFLinear):
            owner = install_quantized(module, name, value)
        elif owner.quantized.shape != value.shape or owner.qtype != value.qtype:
            raise CheckpointError(f"{key!r} is {value.qtype} {value.shape}, expected "
                                  f"{owner.qtype} {owner.quantized.shape}")
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    device = owner.packed.device
    if device.type == "cpu":
        owner.packed = value.data  # the file's mapped pages themselves: no second copy on the CPU
    else:
        owner.packed.copy_(value.data)


def _put_plain(targets: dict[str, torch.Tensor], module: nn.Module, name: str, value: torch.Tensor | QuantizedWeight,
               path: Path, key: str) -> None:
    target = targets.get(name)
    if target is None:
        raise CheckpointError(f"{path}: unexpected tensor {key!r} (no parameter {name!r} in {type(module).__name__})")
    if tuple(value.shape) != tuple(target.shape):
        raise CheckpointError(f"{path}: tensor {key!r} has shape {tuple(value.shape)}, "
                              f"{type(module).__name__}.{name} expects {tuple(target.shape)}")
    tensor = value.dequantize(torch.float32) if isinstance(value, QuantizedWeight) else value
    with torch.no_grad():
        target.copy_(tensor)
