"""FP8 linears on a real device: the scaled_mm path, one quantization per input, generation quality."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from vidloom.layers import fp8 as fp8_module
from vidloom.layers.fp8 import FP8Linear

fp8_cores = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs FP8 tensor cores (compute capability >= 8.9)",
)


@fp8_cores
def test_scaled_mm_path_close_to_dequantized_on_gpu():
    torch.manual_seed(2)
    linear = nn.Linear(256, 512).cuda().bfloat16()
    fp8 = FP8Linear.from_linear(linear).cuda()
    x = torch.randn(4, 77, 256, device="cuda", dtype=torch.bfloat16)
    assert fp8.uses_scaled_mm(x) and not fp8.uses_scaled_mm(x.half())
    ref = torch.nn.functional.linear(x, fp8.dequantized(torch.bfloat16), fp8.bias.bfloat16())
    rel = ((fp8(x).float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert rel < 0.08  # activations are quantized too on the FP8 tensor-core path


@fp8_cores
def test_self_attention_quantizes_its_input_once_on_gpu(monkeypatch):
    from vidloom.models.wan.transformer import WanAttention

    calls = []
    original = fp8_module.quantize_activation
    monkeypatch.setattr(fp8_module, "quantize_activation", lambda x: calls.append(1) or original(x))
    attn = WanAttention(128, 2, eps=1e-6).cuda().bfloat16()
    for name in ("q", "k", "v", "out"):
        setattr(attn, name, FP8Linear.from_linear(getattr(attn, name)).cuda())
    x = torch.randn(1, 64, 128, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        out = attn(x, x)
    assert len(calls) == 2 and torch.isfinite(out).all()  # q/k/v share one; out has its own


def test_fp8_generation_in_bf16_stays_close_to_bf16(demo_cache):
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.request import GenerationRequest
    from vidloom.generator import VideoGenerator

    request = dict(prompt="a red fox jumps", height=32, width=48, num_frames=5, num_inference_steps=3, seed=4)
    plain = VideoGenerator.from_pretrained("wan2.1-demo", device="cuda", dtype="bfloat16", cache_dir=demo_cache)
    quant = VideoGenerator.from_pretrained("wan2.1-demo", device="cuda", dtype="bfloat16", cache_dir=demo_cache,
                                           deploy=DeployConfig(fp8_weights=True))
    a = plain.engine.run(GenerationRequest(**request))["video"].astype(np.float64) / 255
    b = quant.engine.run(GenerationRequest(**request))["video"].astype(np.float64) / 255
    psnr = 10 * np.log10(1.0 / max(np.mean((a - b) ** 2), 1e-12))
    assert psnr > 25, psnr  # e4m3 weights and activations through 3 steps of the demo DiT


def test_fp8_with_float16_is_refused_at_load_on_gpu(demo_cache):
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.errors import DeployError
    from vidloom.generator import VideoGenerator

    with pytest.raises(DeployError, match="needs bfloat16 compute"):
        VideoGenerator.from_pretrained("wan2.1-demo", device="cuda", dtype="float16", cache_dir=demo_cache,
                                       deploy=DeployConfig(fp8_weights=True))
