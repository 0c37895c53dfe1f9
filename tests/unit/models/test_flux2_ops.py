"""Flux2's fused per-token math against its textbook form, and the float32 joint stream under the bf16 cast."""

from __future__ import annotations

import torch
from torch import nn

from vidloom.loading.precision import cast_module
from vidloom.families.flux2.ops import gated_add, norm_modulate, qk_norm_rope, rope_freqs
from vidloom.families.flux2.transformer import Flux2Transformer, Flux2TransformerConfig

AXES = (4, 4, 4, 4)
# One fused rounding (vector_norm, the complex multiply, addcmul) against the textbook's separate ones.
TOLERANCE = 1e-5


def _textbook_rope(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Interleaved cos/sin tables and x * cos + rotate(x) * sin, as diffusers' apply_rotary_emb does."""
    cos, sin = [], []
    for axis, dim in enumerate(AXES):
        freqs = 1.0 / (2000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        angles = torch.outer(ids[:, axis].double(), freqs)
        cos.append(angles.cos().repeat_interleave(2, dim=1).float())
        sin.append(angles.sin().repeat_interleave(2, dim=1).float())
    cos, sin = torch.cat(cos, -1)[None, :, None], torch.cat(sin, -1)[None, :, None]
    real, imag = x.unflatten(-1, (-1, 2)).unbind(-1)
    return x * cos + torch.stack([-imag, real], dim=-1).flatten(3) * sin


def test_qk_norm_rope_matches_rmsnorm_then_rotation_into_a_strided_slice():
    g = torch.Generator().manual_seed(0)
    ids = torch.cartesian_prod(torch.arange(1), torch.arange(2), torch.arange(3), torch.arange(1))
    x = torch.randn(2, 6, 3, 16, generator=g) * 3
    norm = nn.RMSNorm(16, eps=1e-6)
    nn.init.uniform_(norm.weight, 0.5, 1.5)
    joint = torch.zeros(2, 9, 3, 16)  # rows 3.. of a joint q, as a double block fills it: not contiguous
    qk_norm_rope(x, norm, rope_freqs(ids, AXES, 2000.0), joint[:, 3:])
    with torch.no_grad():
        want = _textbook_rope(norm(x), ids)
    assert (joint[:, 3:] - want).abs().max() <= TOLERANCE
    assert joint[:, :3].abs().max() == 0  # the other rows untouched

    half = torch.empty(2, 6, 3, 16, dtype=torch.bfloat16)
    qk_norm_rope(x.bfloat16(), norm.bfloat16(), rope_freqs(ids, AXES, 2000.0), half)
    assert (half.float() - want).abs().max() <= 0.05  # bf16 input and output: a few bf16 ulps


def test_norm_modulate_and_gated_add_use_each_samples_own_modulation():
    g = torch.Generator().manual_seed(1)
    x, update = torch.randn(3, 5, 8, generator=g), torch.randn(3, 5, 8, generator=g)
    shift, scale, gate = (torch.randn(3, 1, 8, generator=g) for _ in range(3))
    want = (1 + scale) * torch.nn.functional.layer_norm(x, (8,), eps=1e-6) + shift
    assert (norm_modulate(x, shift, scale, 1e-6, torch.float32) - want).abs().max() <= TOLERANCE
    half = norm_modulate(x, shift, scale, 1e-6, torch.bfloat16)
    assert half.dtype == torch.bfloat16 and (half.float() - want).abs().max() <= 0.05
    assert (gated_add(x, gate, update.bfloat16()) - (x + gate * update.bfloat16().float())).abs().max() <= TOLERANCE


def test_bf16_cast_keeps_the_joint_stream_float32_and_returns_the_compute_dtype():
    torch.manual_seed(0)
    config = Flux2TransformerConfig(in_channels=8, out_channels=8, num_double_layers=1, num_single_layers=1,
                                    head_dim=16, num_heads=2, text_dim=12, rope_axes=AXES)
    model = cast_module(Flux2Transformer(config), torch.bfloat16, Flux2Transformer.KEEP_FP32).eval()
    img, txt = torch.randn(1, 6, 8).bfloat16(), torch.randn(1, 3, 12).bfloat16()
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(2), torch.arange(3), torch.arange(1))
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(3))
    with torch.inference_mode():
        h, cond = model.embed(img, txt, torch.tensor([0.5]), img_ids, txt_ids)
        after = model.run_blocks(h, cond)
        out = model.head(after, cond)
    assert cond.dtype == torch.bfloat16 and h.dtype == after.dtype == torch.float32
    assert after.shape == (1, 9, config.dim) and out.dtype == torch.bfloat16 and out.shape == (1, 6, 8)


def test_forward_with_grad_enabled_gives_the_inference_values():
    # out= writes are refused by autograd; with grad enabled the ops copy instead, to the same values.
    torch.manual_seed(0)
    config = Flux2TransformerConfig(in_channels=8, out_channels=8, num_double_layers=1, num_single_layers=1,
                                    head_dim=16, num_heads=2, text_dim=12, rope_axes=AXES)
    model = Flux2Transformer(config)
    args = (torch.randn(1, 6, 8), torch.randn(1, 3, 12), torch.tensor([0.5]),
            torch.cartesian_prod(torch.arange(1), torch.arange(2), torch.arange(3), torch.arange(1)),
            torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(3)))
    with torch.inference_mode():
        want = model(*args)
    got = model(*args)
    assert got.requires_grad and torch.equal(got.detach(), want)


def test_norm_modulate_broadcasts_one_modulation_over_the_batch():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 8, generator=g)
    shift, scale = torch.randn(1, 1, 8, generator=g), torch.randn(1, 1, 8, generator=g)
    want = (1 + scale) * torch.nn.functional.layer_norm(x, (8,), eps=1e-6) + shift
    assert (norm_modulate(x, shift, scale, 1e-6, torch.float32) - want).abs().max() <= TOLERANCE
