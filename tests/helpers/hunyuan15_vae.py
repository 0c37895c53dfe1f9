"""Tiny HunyuanVideo-1.5 VAE configs (diffusers AutoencoderKLHunyuanVideo15 config.json dicts) for tests."""

from __future__ import annotations

from typing import Any

import torch

# 8x spatial and 4x temporal compression in four stages, every resample changing channels; 4 latent channels.
TINY_VAE: dict[str, Any] = {
    "_class_name": "AutoencoderKLHunyuanVideo15",
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 4,
    "block_out_channels": [8, 16, 32, 32],
    "layers_per_block": 1,
    "spatial_compression_ratio": 8,
    "temporal_compression_ratio": 4,
    "downsample_match_channel": True,
    "upsample_match_channel": True,
    "scaling_factor": 1.03682,
}


def tiny_vae_config(**overrides: Any) -> dict[str, Any]:
    """TINY_VAE with `overrides` applied (a fresh dict)."""
    return {**TINY_VAE, **overrides}


def perturb_norm_gains(module: torch.nn.Module, seed: int) -> None:
    """RMS gains start at one; move them (by ~0.2) so a norm applied in the wrong place shows in the output."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("gamma"):
                param.add_(0.2 * torch.randn(param.shape, generator=gen))
