"""The one conversion of float frames in [0, 1] to uint8 pixels: outputs, chunks and float input images."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

Frames = TypeVar("Frames", np.ndarray, torch.Tensor)


def to_uint8(frames: Frames) -> Frames:
    """Clamp to [0, 1], scale by 255, round to nearest (half to even), cast; uint8 frames pass through.

    diffusers' `numpy_to_pil` rounds the same way, so the parity tests compare bytes. A tensor stays where it
    lives (e.g. on the GPU, before a 4x smaller host copy) and is scaled in float32, contiguous; an array is
    scaled in its own float dtype. float32 frames give the same bytes either way.
    """
    if isinstance(frames, torch.Tensor):
        if frames.dtype == torch.uint8:
            return frames
        return (frames.float().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).contiguous()
    if frames.dtype == np.uint8:
        return frames
    return (np.clip(frames, 0.0, 1.0) * 255.0).round().astype(np.uint8)
