"""Flux2's per-token math in as few passes over memory as eager PyTorch allows.

A bf16 forward on CPU spends almost as long in these elementwise passes as in its matmuls, so each
function here fuses what the textbook form splits: RoPE as one complex multiply after a q/k RMSNorm
on one float32 working copy, modulation as the LayerNorm's own affine, each gated residual add as one
`addcmul`. The residual stream they read and write is float32 whatever the compute dtype (the float32
islands: normalize, modulate, add residuals); linears and attention get the compute dtype. In float32
they compute what diffusers' Flux2 blocks compute; the fused roundings (addcmul, the LayerNorm affine,
vector_norm) move the result by about one float32 ulp.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rope_freqs(ids: Tensor, axes: tuple[int, ...], theta: float) -> Tensor:
    """Unit complex rotations [S, head_dim // 2] (complex64) for integer position ids [S, len(axes)].

    Follows diffusers' get_1d_rotary_pos_embed (float64 frequencies and angles, cos/sin rounded to
    float32) step by step: the same rounding keeps float32 parity. Pair j of the head dimension is
    channels (2j, 2j + 1), as the reference's interleaved tables lay them out.
    """
    pos = ids.float()
    parts = []
    for axis, dim in enumerate(axes):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=ids.device)[: dim // 2] / dim))
        angles = torch.outer(pos[:, axis], freqs)
        parts.append(torch.complex(angles.cos().float(), angles.sin().float()))
    return torch.cat(parts, dim=-1)


def _writes_in_place() -> bool:
    """Whether `out=` may be used: autograd refuses it (the runtime runs under inference_mode; a caller with
    grad enabled gets the same values through copies)."""
    return not torch.is_grad_enabled()


def _pairs(x: Tensor) -> Tensor:
    """A float32 [..., D] tensor seen as complex64 [..., D // 2] (channels 2j, 2j + 1 -> one number)."""
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)))


def qk_norm_rope(x: Tensor, norm: nn.RMSNorm, freqs: Tensor, out: Tensor) -> Tensor:
    """RMSNorm over the head dim, then the rotary embedding, of x [B, S, H, D]; written into `out`.

    freqs [S, D // 2] (rope_freqs). Both run in float32, the rotation as one complex multiply (the
    reference's x * cos + rotate(x) * sin: the same products), and the result lands in `out` (a
    [B, S, H, D] slice of the joint q or k) in out's dtype.
    """
    eps = torch.finfo(x.dtype).eps if norm.eps is None else norm.eps
    # One float32 working copy, updated in place: rstd = 1 / sqrt(mean(x^2) + eps) from one reduction.
    y = x.float() if x.dtype != torch.float32 else None
    rstd = torch.linalg.vector_norm(x if y is None else y, dim=-1, keepdim=True)
    rstd = rstd.square_().div_(x.shape[-1]).add_(eps).rsqrt_()
    y = torch.mul(x, rstd) if y is None else y.mul_(rstd)
    if norm.weight is not None:
        y.mul_(norm.weight)
    rotation = freqs[:, None, :]  # [S, 1, D // 2] against [B, S, H, D // 2]
    if out.dtype == torch.float32 and _writes_in_place():
        torch.mul(_pairs(y), rotation, out=_pairs(out))
    else:
        out.copy_(torch.view_as_real(_pairs(y).mul_(rotation)).flatten(-2))
    return out


def norm_modulate(x: Tensor, shift: Tensor, scale: Tensor, eps: float, dtype: torch.dtype) -> Tensor:
    """LayerNorm of the float32 stream x [B, S, dim], then (1 + scale) * . + shift in float32, in `dtype`.

    shift/scale [B, 1, dim] (or [1, 1, dim] for every sample): the modulation is the norm's own affine (one
    fused pass), one sample at a time.
    """
    weight, bias = 1 + scale, shift
    per_sample = weight.shape[0] > 1
    rows = [F.layer_norm(x[i], x.shape[-1:], weight[i if per_sample else 0, 0], bias[i if per_sample else 0, 0], eps)
            for i in range(x.shape[0])]
    out = rows[0][None] if len(rows) == 1 else torch.stack(rows)
    return out.to(dtype)


def gated_add(x: Tensor, gate: Tensor, update: Tensor, out: Tensor | None = None) -> Tensor:
    """x + gate * update in float32 (x and gate float32, update any dtype), into `out` when given."""
    update = update.float()  # CPU kernels would cast a mixed-dtype operand anyway; once, here
    if out is None:
        return torch.addcmul(x, gate, update)
    if not _writes_in_place():
        return out.copy_(torch.addcmul(x, gate, update))
    return torch.addcmul(x, gate, update, out=out)


def swiglu(x: Tensor, out: Tensor | None = None) -> Tensor:
    """silu(gate) * value of x = [gate, value] (last dim), into `out` when given. Under no-grad the silu
    overwrites x's gate half: x must be a temporary."""
    gate, value = x.chunk(2, dim=-1)
    if not _writes_in_place():
        result = F.silu(gate) * value
        return result if out is None else out.copy_(result)
    F.silu(gate, inplace=True)
    if out is None:
        return gate * value
    return torch.mul(gate, value, out=out)
