"""FP8 weights: float8_e4m3fn linears with per-output-channel scales, swapped in at load.

On Hopper-class GPUs (compute capability >= 8.9) the matmul runs in FP8 through
`torch._scaled_mm` with per-row dynamic activation scales; elsewhere the weight is
dequantized to the activation dtype just before the matmul, so memory is saved
everywhere and speed only where FP8 tensor cores exist.

`_scaled_mm` with per-row scales only produces bfloat16 on those GPUs, so FP8 on CUDA
needs bfloat16 compute (`check_fp8_compute`, called at load). Projections that read the
same input (q, k, v) share one quantized activation (`project`), so eager mode quantizes
each input once instead of once per linear.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.core.errors import DeployError
from vidloom.layers.gguf_linear import quantized_linears

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448 for e4m3fn (OCP FP8 spec)
SCALED_MM_DTYPE = torch.bfloat16  # the only output dtype _scaled_mm accepts with per-row scales
KERNELS = ("auto", "scaled_mm", "dequant")


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Per-output-channel symmetric quantization: returns (fp8 weight [out, in], fp32 scale [out])."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX
    q = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


@dataclass(frozen=True)
class QuantizedActivation:
    """An activation [..., K] quantized once per row, ready for any FP8Linear that reads it."""

    rows: Tensor
    """float8_e4m3fn [N, K], N = the product of the leading dims."""
    scale: Tensor
    """float32 [N, 1]: row i of the activation is rows[i] * scale[i]."""
    lead_shape: tuple[int, ...]
    """The activation's leading dims, restored on the output."""
    dtype: torch.dtype
    """The activation's dtype, which the output takes."""


def quantize_activation(x: Tensor) -> QuantizedActivation:
    """Dynamic per-row (per-token) symmetric quantization of x [..., K]."""
    rows = x.reshape(-1, x.shape[-1])
    # Few passes over the activation: one reduction for max|x| (no |x| tensor), a division that
    # widens to float32 inside the kernel, an in-place clamp, the cast.
    amax = torch.linalg.vector_norm(rows, float("inf"), dim=1, keepdim=True, dtype=torch.float32)
    scale = amax.clamp(min=1e-12) / FP8_MAX
    q = torch.div(rows, scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return QuantizedActivation(q, scale, tuple(x.shape[:-1]), x.dtype)


def check_fp8_compute(device: torch.device, dtype: torch.dtype) -> None:
    """Refuse FP8 on CUDA with a compute dtype the FP8 matmul cannot produce (called at load)."""
    if device.type == "cuda" and dtype != SCALED_MM_DTYPE:
        raise DeployError(
            f"fp8_weights (--fp8) on CUDA needs bfloat16 compute, got {str(dtype).removeprefix('torch.')}: "
            "the FP8 matmul (torch._scaled_mm with per-row scales) only outputs bfloat16; "
            "use --dtype bfloat16 or drop --fp8"
        )


def _scaled_mm_supported(device: torch.device) -> bool:
    return device.type == "cuda" and hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability(device) >= (8, 9)


class FP8Linear(nn.Module):
    """A Linear whose weight lives in FP8 with one float32 scale per output channel.

    `kernel`: "auto" (scaled_mm on FP8-capable GPUs for bfloat16 inputs, dequantize otherwise),
    or "scaled_mm" / "dequant" to force one path (tests run the scaled_mm path on CPU).
    """

    def __init__(self, weight: Tensor, scale: Tensor, bias: Tensor | None, kernel: str = "auto") -> None:
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.kernel = kernel
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: str = "auto") -> "FP8Linear":
        q, scale = quantize_weight(linear.weight)
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        return cls(q, scale, bias, kernel)

    def dequantized(self, dtype: torch.dtype) -> Tensor:
        return (self.weight.to(torch.float32) * self.scale[:, None]).to(dtype)

    def uses_scaled_mm(self, x: Tensor) -> bool:
        """Whether an input like x goes through the FP8 matmul (else: dequantized weight)."""
        if self.kernel != "auto":
            return self.kernel == "scaled_mm"
        return (
            x.dtype == SCALED_MM_DTYPE
            and x.shape[-1] % 16 == 0
            and self.out_features % 16 == 0
            and _scaled_mm_supported(x.device)
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.uses_scaled_mm(x):
            return self.matmul_quantized(quantize_activation(x))
        return F.linear(x, self.dequantized(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def matmul_quantized(self, x: QuantizedActivation) -> Tensor:
        """The FP8 matmul of an already-quantized activation; output [..., out] in bfloat16, cast to x's dtype."""
        out = torch._scaled_mm(
            x.rows,
            self.weight.t(),  # column-major view, as _scaled_mm wants for its second operand
            scale_a=x.scale,
            scale_b=self.scale[None, :].contiguous(),
            bias=None if self.bias is None else self.bias.to(SCALED_MM_DTYPE),
            out_dtype=SCALED_MM_DTYPE,
        )
        return out.reshape(*x.lead_shape, self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8=e4m3fn, kernel={self.kernel}"


def project(x: Tensor, *linears: nn.Module) -> tuple[Tensor, ...]:
    """Each linear applied to x; when all of them run the FP8 matmul, x is quantized once for all."""
    if len(linears) > 1 and all(isinstance(m, FP8Linear) and m.uses_scaled_mm(x) for m in linears):
        shared = quantize_activation(x)
        return tuple(m.matmul_quantized(shared) for m in linears)  # type: ignore[union-attr]
    return tuple(m(x) for m in linears)


def quantize_linears(module: nn.Module, include: Callable[[str], bool] = lambda name: True) -> int:
    """Replace every nn.Linear under `module` whose qualified name passes `include`; returns the count.

    A module whose weights came from a GGUF file is refused: its linears are already block-quantized, and
    quantizing only the rest would silently mix two schemes."""
    gguf = quantized_linears(module)
    if gguf:
        raise DeployError(f"fp8_weights (--fp8) cannot apply to weights loaded from a GGUF file ({len(gguf)} "
                          f"linears such as {gguf[0]!r} are already quantized); drop --fp8 or load a "
                          ".safetensors file")
    targets = [(name, child) for name, child in module.named_modules() if isinstance(child, nn.Linear) and include(name)]
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, FP8Linear.from_linear(linear))
    return len(targets)
