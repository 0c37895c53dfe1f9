"""FP8 weight quantization: error bounds and the module swap."""

import pytest
import torch
from torch import nn

from vidloom.layers.fp8 import FP8, FP8Linear, quantize_linears, quantize_weight


def test_quantize_roundtrip_error_is_within_e4m3_precision():
    torch.manual_seed(0)
    w = torch.randn(64, 48) * torch.logspace(-2, 1, 64)[:, None]  # channels of very different scale
    q, scale = quantize_weight(w)
    assert q.dtype == FP8 and scale.shape == (64,)
    back = q.float() * scale[:, None]
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 of each channel's max, per element.
    rel = ((back - w).abs() / w.abs().amax(dim=1, keepdim=True)).max().item()
    assert rel <= 2**-4


def test_fp8_linear_matches_dequantized_reference_and_is_close_to_original():
    torch.manual_seed(1)
    linear = nn.Linear(32, 16)
    fp8 = FP8Linear.from_linear(linear)
    x = torch.randn(3, 5, 32)
    exact = torch.nn.functional.linear(x, fp8.dequantized(torch.float32), linear.bias)
    assert torch.allclose(fp8(x), exact, atol=1e-6)
    # vs the unquantized layer: bounded by weight quantization error (~3% of output scale here).
    err = (fp8(x) - linear(x)).abs().max() / linear(x).abs().max()
    assert err < 0.05


def test_quantize_linears_swaps_selected_layers_only():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)))
    count = quantize_linears(model, include=lambda name: name.startswith("2."))
    assert count == 1
    assert isinstance(model[0], nn.Linear) and isinstance(model[2][0], FP8Linear)
    assert model(torch.randn(2, 8)).shape == (2, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_scaled_mm_path_close_to_dequantized_on_gpu():
    torch.manual_seed(2)
    linear = nn.Linear(256, 512).cuda().bfloat16()
    fp8 = FP8Linear.from_linear(linear).cuda()
    x = torch.randn(4, 77, 256, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x, fp8.dequantized(torch.bfloat16), fp8.bias.bfloat16())
    rel = ((fp8(x).float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert rel < 0.08  # activations are quantized too on the FP8 tensor-core path
