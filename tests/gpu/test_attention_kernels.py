"""The real flash-attn / SageAttention kernels through our adapters vs PyTorch SDPA (CUDA and the package needed).

tests/unit/layers/test_attention.py checks the adapters against fake kernels only; this is where the
real kernels' layout and numerics are checked.
"""

import importlib.util

import pytest
import torch

from vidloom.layers.attention import ATTENTION_BACKENDS, attention, resolve_attention

# bf16 inputs, fp32 softmax inside both kernels: bf16 output rounding is ~4e-3 relative; Sage also
# quantizes q/k to int8 (its paper reports cosine similarity > 0.999), so its bound is looser.
TOLERANCE = {"flash": 2e-2, "sage": 6e-2}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["flash", "sage"])
def test_real_kernel_matches_sdpa(name):
    module = ATTENTION_BACKENDS[name].kernel.partition(":")[0]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{ATTENTION_BACKENDS[name].package} is not installed")
    g = torch.Generator(device="cuda").manual_seed(0)
    # [B, S, H, D] with S not a multiple of any block size, as video token counts rarely are.
    q, k, v = (torch.randn(2, 333, 4, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    fn = resolve_attention(name, torch.device("cuda"), torch.bfloat16)
    got, want = fn(q, k, v).float(), attention(q, k, v).float()
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= TOLERANCE[name]
