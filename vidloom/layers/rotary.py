"""Rotate-half rotary embedding and the multimodal-rotary position ids of text tokens (Qwen-VL style decoders)."""

from __future__ import annotations

import torch
from torch import Tensor


def text_positions(start: int, count: int, device: torch.device | None = None) -> Tensor:
    """mrope position ids [3, count] of text tokens: the same running index on the t, h and w axes."""
    return torch.arange(start, start + count, device=device).unsqueeze(0).expand(3, -1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [T, heads, D] rotated by cos/sin [T, D] (rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def axis_frequencies(positions: Tensor, head_dim: int, theta: float) -> Tensor:
    """positions [3, T] (t, h, w) -> rotary angles [3, T, head_dim / 2] per axis (float32), for multimodal rotary
    layouts to mix (Qwen2-VL's consecutive sections, Qwen3-VL's interleaved ones)."""
    steps = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device)
    return positions.float()[..., None] * (1.0 / (theta ** (steps / head_dim)))


def rotary_tables(angles: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Mixed angles [T, head_dim / 2] -> cos, sin [T, head_dim] in `dtype` (rotate-half: both halves alike)."""
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)
