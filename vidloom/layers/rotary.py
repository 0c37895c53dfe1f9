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
