"""vidloom's RMSNorm: torch.nn.RMSNorm's results bit for bit, with its state-dict names."""

from __future__ import annotations

import pytest
import torch

from vidloom.layers.rms_norm import RMSNorm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("shape", "eps"), [((1, 768, 512), 1e-6), ((2, 37, 1536), 1e-5), ((3, 5, 64), 1e-6)])
def test_matches_torch_rms_norm_bit_for_bit(dtype, shape, eps):
    torch.manual_seed(0)
    reference = torch.nn.RMSNorm(shape[-1], eps=eps)
    with torch.no_grad():
        reference.weight.copy_(torch.randn(shape[-1]) * 0.5 + 1.0)
    ours = RMSNorm(shape[-1], eps=eps)
    ours.load_state_dict(reference.state_dict())
    reference, ours = reference.to(dtype), ours.to(dtype)
    x = (torch.randn(shape) * 3.0).to(dtype)
    with torch.no_grad():
        expected, got = reference(x), ours(x)
    assert got.dtype == expected.dtype == dtype
    assert torch.equal(got, expected)


def test_without_eps_or_weight_it_is_torchs_kernel():
    x = torch.randn(2, 8, 16).bfloat16()
    for kwargs in (dict(eps=None), dict(eps=1e-6, elementwise_affine=False)):
        assert torch.equal(RMSNorm(16, **kwargs).bfloat16()(x), torch.nn.RMSNorm(16, **kwargs).bfloat16()(x))
