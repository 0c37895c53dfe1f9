"""A linear whose weight stays block-quantized (GGUF) in memory and is dequantized inside each forward.

The quantized bytes are a buffer, so `.to(device)` moves them and CUDA graphs / torch.compile see a static
tensor; only one layer's dequantized weight exists at a time, which is the point: a Q4_K transformer keeps
~0.28x of its bfloat16 bytes resident. The bias stays a plain parameter in the compute dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.core.errors import CheckpointError
from vidloom.layers.quantized_weight import QuantizedWeight


class GGUFLinear(nn.Module):
    """y = x W^T + b with W kept as `qtype` blocks (`packed`, uint8 [out, bytes per row])."""

    def __init__(self, weight: QuantizedWeight, bias: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        if len(weight.shape) != 2:
            raise ValueError(f"a linear weight is 2-D, got {weight.shape}")
        self.out_features, self.in_features = weight.shape
        self.qtype = weight.qtype
        self.compute_dtype = dtype
        self.register_buffer("packed", weight.data)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @property
    def quantized(self) -> QuantizedWeight:
        return QuantizedWeight(self.packed, self.qtype, (self.out_features, self.in_features))

    @property
    def weight(self) -> Tensor:
        # Models read a linear's weight.dtype / .device to cast their inputs (timestep embeddings); this
        # answers with the weight as computed. It dequantizes, so hot paths call forward instead.
        return self.quantized.dequantize(self.compute_dtype)

    def forward(self, x: Tensor) -> Tensor:
        weight = self.quantized.dequantize(x.dtype)
        return F.linear(x, weight, None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, qtype={self.qtype}"


def install_quantized(module: nn.Module, param_name: str, weight: QuantizedWeight,
                      dtype: torch.dtype | None = None) -> GGUFLinear:
    """Swap the nn.Linear owning `param_name` ("blocks.0.attn1.to_q.weight") under `module` for a GGUFLinear
    holding `weight`; its bias is kept (values and device). `dtype` is what `.weight` reports (None: the
    replaced Linear's dtype, so a float32-kept module stays float32). On a meta-device module the new buffer
    is a meta placeholder of the packed shape, to be allocated and filled like any other tensor.

    CheckpointError when `param_name` is not a Linear's weight or the shapes differ.
    """
    owner_name, _, leaf = param_name.rpartition(".")
    try:
        owner = module.get_submodule(owner_name)
    except AttributeError:
        raise CheckpointError(f"{param_name!r}: no module {owner_name!r} in {type(module).__name__}") from None
    if leaf != "weight" or not isinstance(owner, nn.Linear):
        raise CheckpointError(f"{param_name!r} is quantized, but it is not the weight of a Linear "
                              f"({type(owner).__name__}); only Linear weights can stay quantized")
    if tuple(owner.weight.shape) != weight.shape:
        raise CheckpointError(f"{param_name!r} has shape {weight.shape}, "
                              f"{type(module).__name__}.{owner_name} expects {tuple(owner.weight.shape)}")
    bias = None if owner.bias is None else owner.bias.detach()
    replacement = GGUFLinear(weight.to(owner.weight.device), bias, dtype or owner.weight.dtype)
    parent_name, _, attr = owner_name.rpartition(".")
    setattr(module.get_submodule(parent_name) if parent_name else module, attr, replacement)
    return replacement


def place_quantized(module: nn.Module, name: str, weight: QuantizedWeight, target: Tensor) -> None:
    """Put a file's quantized tensor onto `module`'s parameter `name` (`target`, its current tensor): a Linear's
    weight stays quantized (install_quantized, computing in `target`'s dtype); anything else - norms, embeddings,
    convolutions, modulation tables - is dequantized into `target` once, at load (small, and read as tensors)."""
    owner_name, _, leaf = name.rpartition(".")
    if leaf == "weight" and isinstance(module.get_submodule(owner_name), nn.Linear):
        install_quantized(module, name, weight, target.dtype)
        return
    with torch.no_grad():
        target.copy_(weight.dequantize(torch.float32))


def quantized_linears(module: nn.Module) -> list[str]:
    """Names of the GGUFLinear modules under `module` (empty: a plain model)."""
    return [name for name, child in module.named_modules() if isinstance(child, GGUFLinear)]
