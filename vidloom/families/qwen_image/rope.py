"""Qwen-Image's rotary layout: image tokens on (frame, height, width) axes centred on the grid, text tokens after.

Follows diffusers' QwenEmbedRope step by step (float32 angles, `torch.polar`), which the weights were trained
with: each axis owns `axes[i] // 2` complex channels; with `scale_rope` (every released checkpoint) the height
and width positions run from -(n - n // 2) to n // 2 - 1, and text position p sits at max(h // 2, w // 2) + p on
all three axes at once. Credited in NOTICE.
"""

from __future__ import annotations

import torch
from torch import Tensor

THETA = 10000


def axis_rotations(positions: Tensor, dim: int) -> Tensor:
    """Unit complex rotations [len(positions), dim // 2] (complex64) of integer positions on one axis."""
    inverse = 1.0 / torch.pow(THETA, torch.arange(0, dim, 2).to(torch.float32).div(dim))
    angles = torch.outer(positions.to(torch.float32), inverse)
    return torch.polar(torch.ones_like(angles), angles)


def _centred(n: int) -> Tensor:
    return torch.arange(-(n - n // 2), n // 2)


def image_rotations(frame: int, height: int, width: int, axes: tuple[int, int, int]) -> Tensor:
    """[height * width, head_dim // 2] rotations of one image's tokens (row-major), at frame index `frame`."""
    f = axis_rotations(torch.tensor([frame]), axes[0]).expand(height * width, -1)
    h = axis_rotations(_centred(height), axes[1])[:, None].expand(height, width, -1).reshape(height * width, -1)
    w = axis_rotations(_centred(width), axes[2])[None].expand(height, width, -1).reshape(height * width, -1)
    return torch.cat([f, h, w], dim=-1)


def text_rotations(start: int, length: int, axes: tuple[int, int, int]) -> Tensor:
    """[length, head_dim // 2] rotations of text tokens at positions start .. start + length - 1 on every axis."""
    positions = torch.arange(start, start + length)
    return torch.cat([axis_rotations(positions, dim) for dim in axes], dim=-1)


def joint_rotations(grids: tuple[tuple[int, int], ...], text_length: int, axes: tuple[int, int, int]) -> Tensor:
    """Rotations [L + N, head_dim // 2] in attention order: text, then each image grid (h, w) at frame 0, 1, ...

    Text starts after the largest half-side of any grid (the reference's max_vid_index)."""
    start = max(max(h // 2, w // 2) for h, w in grids)
    images = [image_rotations(i, h, w, axes) for i, (h, w) in enumerate(grids)]
    return torch.cat([text_rotations(start, text_length, axes), *images])


def apply_rotations(x: Tensor, rotations: Tensor) -> Tensor:
    """x [B, S, H, D] rotated pairwise (channels 2j, 2j + 1) by rotations [S, D // 2]; computed in float32."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * rotations[:, None]).flatten(3).type_as(x)
