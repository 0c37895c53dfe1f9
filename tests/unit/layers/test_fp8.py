"""FP8 weight quantization: error bounds and the module swap."""

import pytest
import torch
from torch import nn

from vidloom.core.errors import DeployError
from vidloom.layers import fp8 as fp8_module
from vidloom.layers.fp8 import FP8, FP8Linear, check_fp8_compute, project, quantize_linears, quantize_weight
from vidloom.models.wan.transformer import WanAttention


def test_quantize_roundtrip_error_is_within_e4m3_precision():
    torch.manual_seed(0)
    # Channel maxima spanning ~1e5x: one scale for the whole tensor would leave the smallest channels a few
    # subnormal steps (e4m3's finest is 2^-9 of a scale unit), far past the bound below.
    w = torch.randn(64, 48) * torch.logspace(-3, 2, 64)[:, None]
    q, scale = quantize_weight(w)
    assert q.dtype == FP8 and scale.shape == (64,)
    assert torch.equal(scale, w.abs().amax(dim=1) / 448)  # each channel's own max maps to e4m3's largest, 448
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


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fp8_on_cuda_needs_bfloat16_compute(dtype):
    # _scaled_mm with per-row scales only outputs bf16: refused at load, not at the first forward.
    with pytest.raises(DeployError, match="needs bfloat16 compute"):
        check_fp8_compute(torch.device("cuda"), dtype)
    check_fp8_compute(torch.device("cuda"), torch.bfloat16)
    check_fp8_compute(torch.device("cpu"), dtype)  # CPU dequantizes: any dtype works


def test_fp8_with_float16_on_cuda_is_refused_before_touching_the_device(demo_cache, monkeypatch):
    from vidloom import placement
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    # This machine has no CUDA: let the device check pass so the load reaches the FP8 dtype check,
    # which must refuse before any weight is moved (moving one would fail here).
    monkeypatch.setattr(placement, "resolve_device", lambda device: torch.device("cuda"))
    with pytest.raises(DeployError, match="--fp8.*bfloat16"):
        VideoGenerator.from_pretrained("wan2.1-demo", device="cuda", dtype="float16", cache_dir=demo_cache,
                                       deploy=DeployConfig(fp8_weights=True))


def test_scaled_mm_path_on_cpu_is_close_to_dequantized():
    # torch._scaled_mm has a CPU implementation: the FP8 tensor-core arithmetic (per-row activation
    # scales, per-channel weight scales, bf16 output) runs here with kernel="scaled_mm".
    torch.manual_seed(3)
    linear = nn.Linear(64, 32)
    fp8 = FP8Linear.from_linear(linear, kernel="scaled_mm")
    x = torch.randn(2, 9, 64)
    ref = torch.nn.functional.linear(x, fp8.dequantized(torch.float32), linear.bias)
    out = fp8(x)
    assert out.shape == ref.shape and out.dtype == x.dtype
    rel = ((out - ref).abs().max() / ref.abs().max()).item()
    assert 0 < rel < 0.08  # activations quantized to e4m3 too, and a bf16 output


def _fp8_attention(dim: int = 32, heads: int = 2) -> WanAttention:
    torch.manual_seed(4)
    attn = WanAttention(dim, heads, eps=1e-6)
    for name in ("q", "k", "v", "out"):
        setattr(attn, name, FP8Linear.from_linear(getattr(attn, name), kernel="scaled_mm"))
    return attn


def test_projections_of_one_input_quantize_it_once(monkeypatch):
    calls: list[tuple[int, ...]] = []
    original = fp8_module.quantize_activation

    def counting(x):
        calls.append(tuple(x.shape))
        return original(x)

    monkeypatch.setattr(fp8_module, "quantize_activation", counting)
    attn = _fp8_attention()
    x, text = torch.randn(1, 12, 32), torch.randn(1, 5, 32)
    self_out = attn(x, x)
    # q, k and v share one quantized x; the output projection quantizes its own input.
    assert calls == [(1, 12, 32), (1, 12, 32)]
    calls.clear()
    cross_out = attn(x, text)
    assert calls == [(1, 12, 32), (1, 5, 32), (1, 12, 32)]  # x for q, text for k and v, then out
    # Sharing changes nothing numerically: each linear alone quantizes the same input the same way.
    separate = [m(x) for m in (attn.q, attn.k, attn.v)]
    shared = project(x, attn.q, attn.k, attn.v)
    for a, b in zip(separate, shared):
        assert torch.equal(a, b)
    assert torch.isfinite(self_out).all() and torch.isfinite(cross_out).all()


def test_project_falls_back_to_each_linear_when_not_all_fp8():
    torch.manual_seed(5)
    plain, quant = nn.Linear(16, 16), FP8Linear.from_linear(nn.Linear(16, 16), kernel="scaled_mm")
    x = torch.randn(3, 16)
    a, b = project(x, plain, quant)
    assert torch.equal(a, plain(x)) and torch.equal(b, quant(x))


def test_activation_quantization_is_per_row_max_scaling():
    from vidloom.layers.fp8 import FP8_MAX, quantize_activation

    torch.manual_seed(6)
    x = (torch.randn(2, 5, 32) * torch.logspace(-2, 2, 5)[None, :, None]).bfloat16()
    qa = quantize_activation(x)
    rows = x.reshape(-1, 32).float()
    scale = rows.abs().amax(dim=1, keepdim=True) / FP8_MAX
    assert torch.equal(qa.scale, scale) and qa.lead_shape == (2, 5) and qa.dtype == torch.bfloat16
    assert torch.equal(qa.rows.float(), (rows / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float())
    assert qa.rows.float().abs().amax(dim=1).eq(FP8_MAX).all()  # every row uses the full e4m3 range
