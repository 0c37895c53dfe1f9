"""Sinusoidal timestep features: the input of every diffusion transformer's timestep MLP."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def timestep_features(timestep: Tensor, dim: int, max_period: float = 10000.0, scale: float = 1.0) -> Tensor:
    """Sinusoidal features [B, dim] of (possibly fractional) timesteps, cosines first, in float32.

    `scale` multiplies the angles after the product (diffusers' `Timesteps(scale=...)`: Qwen-Image feeds
    t in [0, 1] with scale 1000; t * 1000 first would round differently)."""
    half = dim // 2
    # Same operation order as diffusers' get_timestep_embedding: at t~1000 a one-ulp difference in a
    # frequency moves the angle by ~1e-4 rad, which would show up in parity.
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=timestep.device)
    freqs = torch.exp(exponent / half)
    angles = timestep[:, None].float() * freqs[None, :]
    if scale != 1.0:
        angles = scale * angles
    features = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    if dim % 2:
        features = F.pad(features, (0, 1))
    return features
