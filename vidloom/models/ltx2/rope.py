"""LTX-2 rotary positions: video patches in (seconds, pixels), audio latents in seconds, text in tokens.

Positions are patch boundaries [start, end) in the original signal's units (video frames become
seconds through the frame rate; audio latents become seconds through the mel hop). The rotary
angle of an axis is (2 * midpoint / max_position - 1) * theta^linspace(0, 1) * pi / 2. Two
layouts exist: "interleaved" rotates (even, odd) channel pairs, "split" rotates the first half of
each head against its second half. The frequency tables and both rotations follow diffusers'
LTX2AudioVideoRotaryPosEmbed / apply_*_rotary_emb step by step (parity at 1e-5 needs the same
rounding; the interleaved rotation is one complex product giving the same float32 values); the function
layout is ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

RopeTables = tuple[Tensor, ...]
"""Interleaved: (rotations,) [B, S, dim // 2, 2], the (cos, sin) of each channel pair (a complex64 view gives the
unit rotations); split: (cos, sin) [B, heads, S, dim // heads // 2]."""


@dataclass(frozen=True)
class RopeSpec:
    """How one attention's rotary tables are built."""

    dim: int  # channels rotated (the attention's inner width)
    heads: int  # split layout: tables are per head
    theta: float
    double_precision: bool  # frequencies in float64 before the float32 cast
    layout: str  # "interleaved" | "split"

    def __post_init__(self) -> None:
        if self.layout not in ("interleaved", "split"):
            raise ValueError(f"rope_type {self.layout!r} is not supported; known: interleaved, split")


def video_positions(
    batch: int, frames: int, height: int, width: int, *, patch_t: int, patch: int,
    scale: tuple[int, int, int], causal_offset: int, fps: float, device: torch.device, first_frame: int = 0,
) -> Tensor:
    """[B, 3, F*H*W, 2] patch bounds: time in seconds, height/width in pixels. `first_frame`: the latent
    index of the first frame (a chunk-causal window keeps each frame's absolute index in the video)."""
    axes = [
        torch.arange(start, start + n, step, dtype=torch.float32, device=device)
        for start, n, step in ((first_frame, frames, patch_t), (0, height, patch), (0, width, patch))
    ]
    start = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=0)  # [3, F, H, W]
    size = torch.tensor((patch_t, patch, patch), dtype=torch.float32, device=device).view(3, 1, 1, 1)
    bounds = torch.stack([start, start + size], dim=-1).flatten(1, 3)  # [3, N, 2]
    bounds = bounds.unsqueeze(0).repeat(batch, 1, 1, 1)
    pixels = bounds * torch.tensor(scale, device=device).view(1, 3, 1, 1)
    # The causal VAE gives the first latent frame one pixel frame, not `scale[0]`: shift and clamp.
    pixels[:, 0] = (pixels[:, 0] + causal_offset - scale[0]).clamp(min=0)
    pixels[:, 0] = pixels[:, 0] / fps
    return pixels


def audio_positions(
    batch: int, frames: int, *, patch_t: int, scale: int, causal_offset: int, hop_length: int,
    sample_rate: int, device: torch.device,
) -> Tensor:
    """[B, 1, frames, 2] latent-frame bounds in seconds of the mel spectrogram they decode to."""
    grid = torch.arange(0, frames, patch_t, dtype=torch.float32, device=device)

    def seconds(latent: Tensor) -> Tensor:
        mel = (latent * scale + causal_offset - scale).clip(min=0)
        return mel * hop_length / sample_rate

    bounds = torch.stack([seconds(grid), seconds(grid + patch_t)], dim=-1)  # [N, 2]
    return bounds.unsqueeze(0).expand(batch, -1, -1).unsqueeze(1)


def rope_tables(positions: Tensor, max_positions: tuple[float, ...], spec: RopeSpec) -> RopeTables:
    """Tables for positions [B, axes, N, 2] (bounds; the midpoint is used) or [B, axes, N] (points)."""
    if positions.ndim == 4:
        start, end = positions.chunk(2, dim=-1)
        positions = ((start + end) / 2.0).squeeze(-1)
    axes = positions.shape[1]
    fractions = torch.stack([positions[:, i] / max_positions[i] for i in range(axes)], dim=-1)  # [B, N, axes]
    return _tables(fractions, spec)


def _tables(fractions: Tensor, spec: RopeSpec) -> RopeTables:
    axes = fractions.shape[-1]
    elems = 2 * axes
    dtype = torch.float64 if spec.double_precision else torch.float32
    ladder = torch.pow(spec.theta, torch.linspace(0.0, 1.0, spec.dim // elems, dtype=dtype, device=fractions.device))
    freqs = (ladder * math.pi / 2.0).to(torch.float32)
    angles = (fractions.unsqueeze(-1) * 2 - 1) * freqs  # [B, N, axes, dim // elems]
    angles = angles.transpose(-1, -2).flatten(2)  # [B, N, axes * (dim // elems)], axis fastest
    # Channel pairs no axis covers are not rotated (cos 1, sin 0), at the front. The reference's interleaved
    # tables repeat each angle for both channels of a pair; ours keep one per pair (the same rotation).
    pad = spec.dim // 2 - angles.shape[-1]
    cos, sin = angles.cos(), angles.sin()
    if pad:
        cos = torch.cat([torch.ones_like(cos[..., :pad]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(sin[..., :pad]), sin], dim=-1)
    if spec.layout == "interleaved":
        return (torch.stack([cos, sin], dim=-1),)
    b, n = cos.shape[:2]
    return (cos.reshape(b, n, spec.heads, -1).swapaxes(1, 2), sin.reshape(b, n, spec.heads, -1).swapaxes(1, 2))


def text_rope_tables(batch: int, length: int, base_length: int, spec: RopeSpec, device: torch.device) -> RopeTables:
    """Tables for token positions 0..length-1 as fractions of `base_length` (the text connectors' 1D rope)."""
    fractions = (torch.arange(length, dtype=torch.float32, device=device) / base_length)
    return _tables(fractions.unsqueeze(0).repeat(batch, 1).unsqueeze(-1), spec)


def apply_rope(x: Tensor, tables: RopeTables, layout: str) -> Tensor:
    """Rotate x [B, S, C] by `tables` (built with the same layout)."""
    if layout == "interleaved":
        (rotations,) = tables
        pairs = x.float().unflatten(2, (-1, 2))
        if torch.compiler.is_compiling():  # real arithmetic, which inductor fuses (it has no complex dtypes)
            (even, odd), (cos, sin) = pairs.unbind(-1), rotations.unbind(-1)
            return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(2).to(x.dtype)
        # One complex product instead of the reference's six real ops and a stack: (even + i odd)(cos + i sin)
        # gives even*cos - odd*sin and even*sin + odd*cos, the same float32 values (as in models/wan).
        rotated = torch.view_as_complex(pairs.contiguous()) * torch.view_as_complex(rotations)
        return torch.view_as_real(rotated).flatten(2).to(x.dtype)
    cos, sin = tables
    b, h, s, _ = cos.shape
    halves = x.reshape(b, s, h, 2, -1).swapaxes(1, 2).float()  # [B, H, S, 2, r]
    first, second = halves[..., :1, :], halves[..., 1:, :]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    out = halves * cos
    out[..., :1, :].addcmul_(-sin, second)
    out[..., 1:, :].addcmul_(sin, first)
    return out.flatten(-2).swapaxes(1, 2).reshape(b, s, -1).to(x.dtype)
