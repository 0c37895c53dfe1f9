"""The Wan DiT's fused elementwise ops against the written-out formulas they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vidloom.models.wan.ops import (
    apply_rope,
    apply_rope_reference,
    gated_residual,
    modulate,
    rope_freqs,
    rope_tables,
)

GRID = (3, 4, 6)  # frames, height, width of the patch grid: S = 72 tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_complex_rope_equals_the_six_op_real_rotation(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 72, 3, 16, generator=gen).to(dtype)
    cos, sin = rope_tables(GRID, 16, torch.device("cpu"))
    freqs = rope_freqs(GRID, 16, torch.device("cpu"))
    assert freqs.shape == (72, 8, 2) and freqs.dtype == torch.float32
    got = apply_rope(x, freqs)
    assert got.dtype == dtype
    # Same products and sums in float32, one rounding: bit-identical on CPU.
    assert torch.equal(got, apply_rope_reference(x, cos, sin))
    # And it is a rotation: pair norms are kept (float32 check).
    pairs = lambda t: t.float().unflatten(-1, (-1, 2)).norm(dim=-1)  # noqa: E731
    if dtype == torch.float32:
        assert torch.allclose(pairs(got), pairs(x), atol=1e-5)


def test_rope_on_a_shard_of_the_table_matches_the_whole():
    # Sequence parallelism slices the [S, D/2, 2] table by rows; the complex view must follow.
    x = torch.randn(1, 72, 2, 16)
    freqs = rope_freqs(GRID, 16, torch.device("cpu"))
    whole = apply_rope(x, freqs)
    assert torch.equal(apply_rope(x[:, 36:], freqs[36:]), whole[:, 36:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_modulation_and_gated_residual_match_the_formulas(dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 64, 48, generator=gen).to(dtype)
    update = torch.randn(2, 64, 48, generator=gen).to(dtype)
    shift, scale, gate = (torch.randn(2, 1, 48, generator=gen) for _ in range(3))
    normed = F.layer_norm(x.float(), (48,), None, None, 1e-6)
    formula_mod = (normed * (1 + scale) + shift).to(dtype)
    formula_res = (x.float() + update.float() * gate).to(dtype)
    # Unfused (the CPU default): exactly the formulas, which the bf16 parity test pins to diffusers.
    assert torch.equal(modulate(x, shift, scale, 1e-6), formula_mod)
    assert torch.equal(gated_residual(x, update, gate), formula_res)
    # Fused (the CUDA default): a fused multiply-add rounds once instead of twice in float32,
    # so at most 1 float32 ulp apart before the cast, i.e. at most 1 ulp of dtype after it.
    fused_mod = modulate(x, shift, scale, 1e-6, fused=True)
    fused_res = gated_residual(x, update, gate, fused=True)
    assert fused_mod.dtype == fused_res.dtype == dtype
    ulp = torch.finfo(dtype).eps
    for fused, formula in ((fused_mod, formula_mod), (fused_res, formula_res)):
        rel = ((fused.float() - formula.float()).abs() / formula.float().abs().clamp(min=1.0)).max().item()
        assert rel <= ulp, rel
