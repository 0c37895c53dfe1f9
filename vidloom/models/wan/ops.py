"""The Wan DiT's elementwise ops: 3D RoPE tables and rotation, AdaLN modulation and the gated residual.

Shared with the families built on Wan's blocks (the causal Wan and Helios transformers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def rope_tables(
    grid: tuple[int, int, int], head_dim: int, device: torch.device, theta: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """cos/sin tables [S, head_dim // 2] for a (frames, height, width) patch grid, in float32.

    Each head's channel pairs are split among the three axes (time gets the
    remainder); token order is frames-major, matching the flattened patch grid.
    """
    hw_dim = 2 * (head_dim // 6)
    axis_dims = (head_dim - 2 * hw_dim, hw_dim, hw_dim)
    # Angles in float64 then rounded once, as the reference does, so large
    # positions keep their precision before cos/sin.
    per_axis: list[Tensor] = []
    for extent, dim in zip(grid, axis_dims):
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)
        positions = torch.arange(extent, dtype=torch.float64, device=device)
        per_axis.append(torch.outer(positions, inv_freq))
    frames, height, width = grid
    angles = torch.cat(
        [
            per_axis[0][:, None, None, :].expand(frames, height, width, -1),
            per_axis[1][None, :, None, :].expand(frames, height, width, -1),
            per_axis[2][None, None, :, :].expand(frames, height, width, -1),
        ],
        dim=-1,
    ).reshape(frames * height * width, head_dim // 2)
    return angles.cos().float(), angles.sin().float()


def rope_freqs(grid: tuple[int, int, int], head_dim: int, device: torch.device) -> Tensor:
    """`rope_tables` as one float32 table [S, head_dim // 2, 2] of (cos, sin) pairs: a complex64 view
    of it gives the unit rotations, and it stays a real tensor for torch.compile and sharding."""
    return torch.stack(rope_tables(grid, head_dim, device), dim=-1)


def apply_rope(x: Tensor, freqs: Tensor) -> Tensor:
    """Rotate adjacent channel pairs of x [B, S, H, D] by freqs [S, D/2, 2] (cos, sin).

    Eager mode multiplies complex numbers: one float32 kernel instead of six strided real
    ops plus a stack (the products even*cos - odd*sin and even*sin + odd*cos are the same,
    bit for bit on CPU). Under torch.compile the real form is traced instead
    (`apply_rope_reference`), which inductor fuses into one kernel without complex dtypes.
    Either way the rotation runs in float32 and rounds once to x's dtype.
    """
    if torch.compiler.is_compiling():
        return apply_rope_reference(x, freqs[..., 0], freqs[..., 1])
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())
    rotation = torch.view_as_complex(freqs.contiguous())
    return torch.view_as_real(pairs * rotation[None, :, None, :]).flatten(-2).type_as(x)


def apply_rope_reference(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The rotation written out on real numbers (diffusers' form); cos/sin [S, D/2]."""
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs.unbind(-1)
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return rotated.flatten(-2).type_as(x)


def modulate(x: Tensor, shift: Tensor, scale: Tensor, eps: float, fused: bool | None = None) -> Tensor:
    """AdaLN: LayerNorm(x) * (1 + scale) + shift in float32, rounded once to x's dtype.

    `fused` (default: on CUDA) does the multiply and add in one pass (addcmul, a fused
    multiply-add: one fp32 rounding fewer). CPU keeps the two-op form, whose bits match
    diffusers exactly (the bf16 parity test pins them); the GPU is where the passes cost time.
    """
    normed = F.layer_norm(x.float(), (x.shape[-1],), None, None, eps)
    if x.is_cuda if fused is None else fused:
        # out= in x's dtype: computed in float32, rounded as it is stored (no float32 result pass).
        return torch.addcmul(shift, normed, 1 + scale, out=torch.empty_like(x))
    return (normed * (1 + scale) + shift).type_as(x)


def gated_residual(x: Tensor, update: Tensor, gate: Tensor, fused: bool | None = None) -> Tensor:
    """x + update * gate in float32 (gate is float32), rounded once to x's dtype.

    `fused` (default: on CUDA): one addcmul pass that widens x and update inside the kernel and
    stores in x's dtype, instead of an upcast, a multiply, an add and a cast; CPU keeps the
    bit-exact form (see `modulate`).
    """
    if x.is_cuda if fused is None else fused:
        return torch.addcmul(x, update, gate, out=torch.empty_like(x))
    return (x.float() + update * gate).type_as(x)
