"""The Kaiser window of BigVGAN's anti-aliasing low-pass filters (LTX-2's and Qwen-Omni's vocoders)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def kaiser_grid(half_width: float, taps: int, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """(window, times) of a `taps`-long low-pass whose transition is `half_width` (of the sample rate) wide: the
    Kaiser window, beta from Kaiser's attenuation formula, and each tap's offset in samples from the centre."""
    half = taps // 2
    attenuation = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(taps, beta=beta, periodic=False, dtype=dtype)
    times = torch.arange(-half, half) + 0.5 if taps % 2 == 0 else torch.arange(taps) - half
    return window, times
