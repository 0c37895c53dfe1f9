"""Layers of the Wan2.1 video VAE, with causal time handling driven by a per-call cache."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import attention
from vidloom.layers.onednn_conv import Conv2d, Conv3d
from vidloom.models.wan.vae_causal import HISTORY_FRAMES, CausalCache, CausalConv3d  # noqa: F401 (re-exported)
from vidloom.layers.upsample_conv import upsample2x_conv3x3

NORM_EPS = 1e-12  # F.normalize's default, which the reference uses


class RMSNorm(nn.Module):
    """Wan's "RMS norm": L2-normalise over channels, then scale by sqrt(dim) and a learned gain."""

    def __init__(self, dim: int, spatial_dims: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim, *(1,) * spatial_dims))
        self.scale = dim**0.5

    def forward(self, x: Tensor) -> Tensor:
        # x * (sqrt(dim) / max(|x|, eps)) * gamma: one pass fewer than normalise-then-scale.
        return (x * self._inverse_norm(x)).mul_(self.gamma)

    def silu_into(self, x: Tensor, out: Tensor) -> Tensor:
        """`out = silu(self(x))`, written into `out` (a causal conv's input buffer): no tensor of its own."""
        torch.mul(x, self._inverse_norm(x), out=out)
        return F.silu(out.mul_(self.gamma), inplace=True)

    def _inverse_norm(self, x: Tensor) -> Tensor:
        """sqrt(dim) / max(|x|, eps) over the channels, in x's dtype. CPU and CUDA reductions accumulate bfloat16
        in float32, so bf16 needs no float32 copy of x; float16 would overflow the sum of squares and is widened."""
        wide = torch.float32 if x.dtype == torch.float16 else None
        norm = torch.linalg.vector_norm(x, dim=1, keepdim=True, dtype=wide)
        return (self.scale / norm.clamp_min(NORM_EPS)).to(x.dtype)


def per_frame(x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """Apply a 2D image op `fn` to every frame of a [B, C, T, H, W] video."""
    b, c, t, h, w = x.shape
    y = fn(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
    return y.view(b, t, *y.shape[1:]).permute(0, 2, 1, 3, 4)


class ResidualBlock(nn.Module):
    """Norm-SiLU-conv twice, plus a (projected when channels change) skip connection."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.norm1 = RMSNorm(in_dim, spatial_dims=3)
        self.conv1 = CausalConv3d(in_dim, out_dim, 3, padding=1)
        self.norm2 = RMSNorm(out_dim, spatial_dims=3)
        self.conv2 = CausalConv3d(out_dim, out_dim, 3, padding=1)
        self.skip = CausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else None

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        skip = x if self.skip is None else self.skip(x)
        # Each norm + SiLU writes straight into its conv's input buffer (after the frames of the previous chunk).
        h = cache.stream(self.conv1, x, self.norm1.silu_into)
        # Dropout is a no-op at inference, so it is left out.
        h = cache.stream(self.conv2, h, self.norm2.silu_into)
        return h.add_(skip)  # the conv's output is fresh


class FrameAttention(nn.Module):
    """Single-head self-attention among the pixels of each frame; frames do not mix."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, spatial_dims=2)
        self.to_qkv = Conv2d(dim, dim * 3, 1)
        self.proj = Conv2d(dim, dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, t, h, w = x.shape
        frames = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        qkv = self.to_qkv(self.norm(frames)).flatten(2).transpose(1, 2).contiguous()
        # [frames, pixels, 1 head, c] is the layout the shared attention entry point takes.
        q, k, v = (part.unsqueeze(2) for part in qkv.chunk(3, dim=-1))
        out = attention(q, k, v).squeeze(2).transpose(1, 2).reshape(b * t, c, h, w)
        out = self.proj(out).view(b, t, c, h, w).permute(0, 2, 1, 3, 4)
        return out + x


class MidBlock(nn.Module):
    """Residual block, frame attention, residual block: the bottleneck of both halves."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.res_in = ResidualBlock(dim, dim)
        self.attn = FrameAttention(dim)
        self.res_out = ResidualBlock(dim, dim)

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        return self.res_out(self.attn(self.res_in(x, cache)), cache)


class Downsample(nn.Module):
    """Halve height and width; with `temporal`, also halve the frames that follow the first."""

    def __init__(self, dim: int, temporal: bool) -> None:
        super().__init__()
        self.spatial = Conv2d(dim, dim, 3, stride=2)
        self.temporal = Conv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1)) if temporal else None

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        # Pad right/bottom only, so an even size halves exactly with a stride-2 kernel of 3.
        x = per_frame(x, lambda f: self.spatial(F.pad(f, (0, 1, 0, 1))))
        if self.temporal is None:
            return x
        slot = cache.claim()
        past = cache.get(slot)
        if not cache.last:
            cache.put(slot, x[:, :, -1:].clone())
        if past is None:
            # The first chunk is the lone first frame; it keeps a latent frame of its own.
            return x
        # One frame of overlap with the previous chunk makes stride-2 windows line up
        # across chunk borders, so every pair of new frames yields one output frame.
        return self.temporal(torch.cat([past, x], dim=2))


class Upsample(nn.Module):
    """Double height and width (halving channels); with `temporal`, also double frames after the first."""

    def __init__(self, dim: int, temporal: bool, out_dim: int | None = None) -> None:
        """`out_dim`: channels out (Wan2.1 halves them: the default; Wan2.2's residual stages keep them)."""
        super().__init__()
        self.temporal = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0)) if temporal else None
        self.spatial = Conv2d(dim, dim // 2 if out_dim is None else out_dim, 3, padding=1)

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        if self.temporal is not None:
            x = self._double_frames(x, cache)
        # Computed on the low-resolution frames (vidloom/layers/upsample_conv.py): 4/9 of the multiply-adds.
        return per_frame(x, lambda f: upsample2x_conv3x3(f, self.spatial))

    def _double_frames(self, x: Tensor, cache: CausalCache) -> Tensor:
        if cache.chunks == 1:
            # The first latent frame stands for one video frame, not two; later chunks
            # start this conv's stream from zero history (an empty tail).
            cache.put(cache.claim(), x[:, :, :0])
            return x
        y = cache.stream(self.temporal, x)
        b, c, t, h, w = x.shape
        # The two channel halves are consecutive output frames; interleave them in time.
        return y.view(b, 2, c, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c, t * 2, h, w)

