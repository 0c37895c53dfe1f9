"""SparseMoE.fixed_experts (the dispatch a captured decode step runs: no host read) against the grouped dispatch, on
both of its branches: per (token, expert) pair when T * k <= experts, every expert over every token past that.
Float32; the two sum each token's experts in another order: 1e-5 relative to the output's magnitude."""

from __future__ import annotations

import pytest
import torch

from vidloom.families.qwen3_omni.moe import SparseMoE


@pytest.mark.parametrize("tokens", [1, 2, 3, 5, 16])  # 8 experts, top 3: per pair up to 2 tokens, then every expert
@pytest.mark.parametrize("shared", [0, 12])
def test_fixed_experts_equal_the_grouped_dispatch(tokens, shared):
    torch.manual_seed(tokens)
    moe = SparseMoE(16, 24, experts=8, top_k=3, normalize=False, shared_inner=shared)
    for parameter in moe.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    x = torch.randn(tokens, 16)
    with torch.no_grad():
        grouped, fixed = moe(x), moe(x, fixed_shapes=True)
    assert fixed.shape == grouped.shape
    assert (fixed - grouped).abs().max() <= 1e-5 * grouped.abs().max()
