"""FP8 weights through the denoiser contract (runtime.fp8_denoisers): every family whose card declares
`fp8_weights` gets its DiT block linears as FP8Linear, with no family code.

On CPU the FP8 weight is dequantized just before each matmul (vidloom/layers/fp8.py), so this measures the
quantization error alone (fp32 compute, tiny random checkpoints; PSNR of uint8 frames, or of the waveform
against its peak, vs the fp32 run):

| family       | PSNR    |
|--------------|---------|
| LTX-2        | 36.7 dB |
| Cosmos3      | 44.9 dB |
| AnyFlow-FAR  | 41.6 dB |
| Stable Audio | 52.9 dB |
| SANA-WM      | 54.7 dB |

The bound per family is the lowest value seen (two runs on separately written folders moved by up to 2.6 dB) less
~3 dB. FP8 matmuls (torch._scaled_mm) need a GPU of compute
capability >= 8.9; they are checked by tests/unit/layers/test_fp8.py's kernel tests, not here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.integration.test_denoiser_acceleration import (
    MORE_WRITERS, WRITERS, _generator, _peak, _request, _run_more, psnr,
)
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.layers.fp8 import FP8Linear
from vidloom.runtime.fp8_denoisers import quantize_denoisers

LEAST_DB = {"ltx2": 33.0, "cosmos3": 41.5, "far": 36.0, "stable-audio": 47.5, "sana-wm": 51.5}


def _fp8_linears(gen: Any) -> int:
    return sum(isinstance(m, FP8Linear) for c in gen.engine.instance.components.values()
               if isinstance(c, torch.nn.Module) for m in c.modules())


def _block_linears_left(gen: Any) -> int:
    """nn.Linear modules still inside any denoiser's blocks (compile units)."""
    return sum(isinstance(m, torch.nn.Linear) for c in gen.engine.instance.components.values()
               if hasattr(c, "compile_units") for unit in c.compile_units() for m in unit.modules())


def _run(kind: str, folder: Path, **deploy: Any) -> tuple[np.ndarray, Any]:
    if kind in WRITERS:
        gen = _generator(folder, **deploy)
        return gen.run(_request(kind)).frames, gen
    out, _ = _run_more(kind, folder, **deploy)
    return out, None


@pytest.mark.parametrize("kind", ["ltx2", "cosmos3", "far", "stable-audio", "sana-wm"])
def test_fp8_blocks_stay_close_to_full_precision(kind, tmp_path):
    if kind == "stable-audio":
        pytest.importorskip("torchsde")
    folder = {**WRITERS, **MORE_WRITERS}[kind](tmp_path / kind)
    gen = _generator(folder, fp8_weights=True)
    assert _fp8_linears(gen) > 0 and _block_linears_left(gen) == 0
    plain, _ = _run(kind, folder)
    out, _ = _run(kind, folder, fp8_weights=True)
    peak = _peak(kind, plain) if kind in MORE_WRITERS else 255.0
    value = psnr(out / peak * 255.0, plain / peak * 255.0)
    print(f"{kind} fp8: {value:.1f} dB")
    assert np.isfinite(out).all() and not np.array_equal(out, plain)  # the weights really are FP8
    assert value > LEAST_DB[kind], value


def test_a_component_without_blocks_is_refused():
    with pytest.raises(DeployError, match="fp8_weights"):
        quantize_denoisers({"vae": torch.nn.Linear(4, 4)}, torch.device("cpu"), torch.float32, "tiny")


def test_fp8_on_cuda_needs_bfloat16_compute():
    # The FP8 matmul's output dtype decides this before any weight is touched (no CUDA needed to check).
    with pytest.raises(DeployError, match="bfloat16"):
        quantize_denoisers({}, torch.device("cuda"), torch.float16, "tiny")


def test_chat_only_cosmos3_refuses_fp8():
    from vidloom.families.cosmos3.cards import CHAT_ONLY_CAPABILITIES

    with pytest.raises(DeployError, match="fp8_weights.*chat only"):
        CHAT_ONLY_CAPABILITIES.refuse_unsupported(DeployConfig(fp8_weights=True), "m", "cosmos3")
