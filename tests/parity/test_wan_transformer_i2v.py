"""Parity: the image cross-attention (Wan2.1 I2V / FLF2V) and per-token timesteps (Wan2.2 TI2V)
of our WanTransformer against diffusers' WanTransformer3DModel."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.parity.test_wan_transformer import FP32_TOL, _ours, _reference

diffusers = pytest.importorskip("diffusers")

BASE = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=12,
    out_channels=4, text_dim=24, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
)
TEXT_LEN = 512  # diffusers splits image tokens off the cross-attention context at len - 512


def _compare(ref: torch.nn.Module, latents, timestep, text, image=None) -> float:
    ours = _ours(ref)
    with torch.no_grad():
        expected = ref(latents, timestep, text, encoder_hidden_states_image=image, return_dict=False)[0]
        got = ours(latents, timestep, text, image)
    assert got.shape == expected.shape
    return float((got - expected).abs().max())


@pytest.mark.parametrize("images", [1, 2], ids=["i2v", "first-last"])
def test_image_cross_attention_matches(images: int) -> None:
    image_tokens, image_dim = 5, 20
    kwargs: dict[str, Any] = dict(BASE, image_dim=image_dim, added_kv_proj_dim=24)
    if images == 2:
        kwargs["pos_embed_seq_len"] = 2 * image_tokens
    ref = _reference(kwargs)
    gen = torch.Generator().manual_seed(3)
    latents = torch.randn(1, 12, 3, 4, 6, generator=gen)
    text = torch.randn(1, TEXT_LEN, 24, generator=gen)
    image = torch.randn(images, image_tokens, image_dim, generator=gen) * 3
    diff = _compare(ref, latents, torch.tensor([640.0]), text, image)
    assert diff <= FP32_TOL
    # The image must matter, or this test would pass with the image path dropped.
    with torch.no_grad():
        moved = float((_ours(ref)(latents, torch.tensor([640.0]), text, torch.randn_like(image))
                       - _ours(ref)(latents, torch.tensor([640.0]), text, image)).abs().max())
    assert moved > 1e-2


def test_per_token_timesteps_match() -> None:
    ref = _reference(dict(BASE, in_channels=4))
    gen = torch.Generator().manual_seed(4)
    latents = torch.randn(2, 4, 3, 4, 6, generator=gen)
    tokens = 3 * 2 * 3
    timestep = torch.full((2, tokens), 700.0)
    timestep[:, : tokens // 3] = 0.0  # the first latent frame clean, as TI2V's image frame
    text = torch.randn(2, 7, 24, generator=gen)
    assert _compare(ref, latents, timestep, text) <= FP32_TOL
