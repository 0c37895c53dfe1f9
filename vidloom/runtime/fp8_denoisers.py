"""FP8 weights for any family's denoiser, applied from outside the model through the denoiser contract.

The units a resident denoiser declares for `compile` (core.denoiser.CompileUnits: its DiT blocks, or an AR
decoder's blocks split around attention) hold almost all of its weights; their linears become FP8Linear
(vidloom/layers/fp8.py: float8_e4m3fn with one fp32 scale per output channel), while embeddings, the head and
everything outside the blocks stay in full precision. Written once for every family: a card that declares
`fp8_weights` must hold such a component.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from vidloom.core.denoiser import CompileUnits
from vidloom.core.errors import DeployError
from vidloom.layers.fp8 import FP8Linear, check_fp8_compute, quantize_linears


def quantize_denoisers(components: Mapping[str, Any], device: torch.device, dtype: torch.dtype,
                       model_id: str) -> int:
    """Swap the block linears of every resident denoiser for FP8Linear; returns how many linears are FP8 now
    (a loader that quantized its own blocks already, as Wan's does before they reach the device, counts too)."""
    check_fp8_compute(device, dtype)
    units = [unit for component in components.values() if isinstance(component, CompileUnits)
             for unit in component.compile_units()]
    if not units:
        raise DeployError(f"fp8_weights (--fp8): {model_id} loaded no component that declares its blocks")
    for unit in units:
        quantize_linears(unit)
    return sum(isinstance(m, FP8Linear) for unit in units for m in unit.modules())
