"""FP8 single files: float8 weights with per-tensor scales, dequantized to the compute dtype as they are read.

Two spellings of the same scheme are read: ComfyUI's `scaled_fp8` files (`<layer>.scale_weight`, a `scaled_fp8`
marker, `<layer>.scale_input`) and its newer mixed-precision files (`<layer>.weight_scale`, `<layer>.input_scale`,
`<layer>.comfy_quant`). The rule: `weight.float() * scale`, a scalar or one value per output row; a float8 weight
without a scale is `weight.float()`. Activation scales and markers are bookkeeping for an FP8 matmul we do not run
(the compute dtype runs instead), so they are not read.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from vidloom.core.errors import CheckpointError

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
SCALE_NAMES = ("scale_weight", "weight_scale")  # of `<layer>.weight`: scaled_fp8 files, mixed-precision files
BOOKKEEPING = ("scaled_fp8", "scale_input", "input_scale", "comfy_quant")


def weight_keys(keys: Iterable[str]) -> list[str]:
    """The keys a loader reads: without the bookkeeping and without each scale whose weight is in the file (a
    parameter that only happens to be named like a scale still loads)."""
    present = set(keys)
    out = []
    for key in keys:
        layer, _, last = key.rpartition(".")
        if last in BOOKKEEPING or (last in SCALE_NAMES and f"{layer}.weight" in present):
            continue
        out.append(key)
    return out


def scale_key(key: str, present: set[str]) -> str | None:
    """The scale stored for weight `key`, if the file has one."""
    if not key.endswith(".weight"):
        return None
    layer = key[: -len(".weight")]
    return next((f"{layer}.{name}" for name in SCALE_NAMES if f"{layer}.{name}" in present), None)


def dequantize(key: str, weight: torch.Tensor, read_scale: Callable[[], torch.Tensor | None]) -> torch.Tensor:
    """`weight` (float8) as float32 times its scale; a block-wise scale is refused naming the key."""
    out = weight.float()
    scale = read_scale()
    if scale is None:
        return out
    scale = scale.float()
    if scale.numel() == 1:
        return out * scale.reshape(())
    if out.dim() >= 1 and scale.numel() == out.shape[0]:  # one scale per output row (per-channel)
        return out * scale.reshape(-1, *([1] * (out.dim() - 1)))
    raise CheckpointError(f"tensor {key!r}: its scale has shape {tuple(scale.shape)}, neither per-tensor nor "
                          f"per-row for a weight of shape {tuple(out.shape)} (a block-wise format vidloom does not "
                          f"read)")
