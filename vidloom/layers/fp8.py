"""FP8 weights: float8_e4m3fn linears with per-output-channel scales, swapped in at load.

On Hopper-class GPUs (compute capability >= 8.9) the matmul runs in FP8 through
`torch._scaled_mm` with per-row dynamic activation scales; elsewhere the weight is
dequantized to the activation dtype just before the matmul, so memory is saved
everywhere and speed only where FP8 tensor cores exist.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448 for e4m3fn (OCP FP8 spec)


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Per-output-channel symmetric quantization: returns (fp8 weight [out, in], fp32 scale [out])."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX
    q = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def _scaled_mm_supported(device: torch.device) -> bool:
    return device.type == "cuda" and hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability(device) >= (8, 9)


class FP8Linear(nn.Module):
    """A Linear whose weight lives in FP8 with one float32 scale per output channel."""

    def __init__(self, weight: Tensor, scale: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "FP8Linear":
        q, scale = quantize_weight(linear.weight)
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        return cls(q, scale, bias)

    def dequantized(self, dtype: torch.dtype) -> Tensor:
        return (self.weight.to(torch.float32) * self.scale[:, None]).to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        if _scaled_mm_supported(x.device) and x.shape[-1] % 16 == 0 and self.out_features % 16 == 0:
            return self._forward_fp8(x)
        return F.linear(x, self.dequantized(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def _forward_fp8(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])
        x_scale = rows.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
        x_q = (rows.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        out = torch._scaled_mm(
            x_q,
            self.weight.t(),  # column-major view, as _scaled_mm wants for its second operand
            scale_a=x_scale,
            scale_b=self.scale[None, :].contiguous(),
            bias=None if self.bias is None else self.bias.to(x.dtype),
            out_dtype=x.dtype,
        )
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8=e4m3fn"


def quantize_linears(module: nn.Module, include: Callable[[str], bool] = lambda name: True) -> int:
    """Replace every nn.Linear under `module` whose qualified name passes `include`; returns the count."""
    targets = [(name, child) for name, child in module.named_modules() if isinstance(child, nn.Linear) and include(name)]
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, FP8Linear.from_linear(linear))
    return len(targets)
