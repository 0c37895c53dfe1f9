"""The Wan2.2 VAE's additions to the Wan2.1 layers: residual resampling stages and pixel patching.

Wan2.2 (TI2V-5B) wraps each encoder stage in a parameter-free shortcut that averages the stage
input down to the output's shape, and each decoder stage in one that duplicates it up; frames
are also folded 2x2 into channels before the encoder and unfolded after the decoder. The
shortcuts are reshapes and a mean whose order we follow exactly as diffusers' AvgDown3D /
DupUp3D / patchify compute them (the float sums must round the same way for parity).
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.models.wan.vae_blocks import CausalCache, Downsample, ResidualBlock, Upsample


def patchify(x: Tensor, patch: int) -> Tensor:
    """[B, C, F, H, W] -> [B, C * patch^2, F, H / patch, W / patch] (channel order: c, then w-, then h-offset)."""
    if patch == 1:
        return x
    b, c, f, h, w = x.shape
    x = x.view(b, c, f, h // patch, patch, w // patch, patch).permute(0, 1, 6, 4, 2, 3, 5)
    return x.reshape(b, c * patch * patch, f, h // patch, w // patch)


def unpatchify(x: Tensor, patch: int) -> Tensor:
    """The inverse of `patchify`."""
    if patch == 1:
        return x
    b, cp, f, h, w = x.shape
    c = cp // (patch * patch)
    x = x.view(b, c, patch, patch, f, h, w).permute(0, 1, 4, 5, 3, 6, 2)
    return x.reshape(b, c, f, h * patch, w * patch)


def average_down(x: Tensor, out_dim: int, factor_t: int, factor_s: int) -> Tensor:
    """Fold time (front-padded with zeros to a multiple of factor_t) and space into channels, then
    average groups of channels down to out_dim: a shortcut with the shape of a downsampling stage's output."""
    pad_t = (factor_t - x.shape[2] % factor_t) % factor_t
    x = F.pad(x, (0, 0, 0, 0, pad_t, 0))
    b, c, t, h, w = x.shape
    x = x.view(b, c, t // factor_t, factor_t, h // factor_s, factor_s, w // factor_s, factor_s)
    x = x.permute(0, 1, 3, 5, 7, 2, 4, 6).contiguous()
    group = c * factor_t * factor_s * factor_s // out_dim
    return x.view(b, out_dim, group, t // factor_t, h // factor_s, w // factor_s).mean(dim=2)


def duplicate_up(x: Tensor, out_dim: int, factor_t: int, factor_s: int, first_chunk: bool) -> Tensor:
    """Repeat channels and unfold them into time and space: the shortcut of an upsampling stage.
    On the first chunk only the last of the factor_t frames is kept (the lone first frame)."""
    repeats = out_dim * factor_t * factor_s * factor_s // x.shape[1]
    x = x.repeat_interleave(repeats, dim=1)
    b, _, t, h, w = x.shape
    x = x.view(b, out_dim, factor_t, factor_s, factor_s, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4).contiguous()
    x = x.view(b, out_dim, t * factor_t, h * factor_s, w * factor_s)
    return x[:, :, factor_t - 1 :] if first_chunk else x


def add_duplicate_up(out: Tensor, x: Tensor, factor_t: int, factor_s: int, first_chunk: bool) -> Tensor:
    """`out += duplicate_up(x, ...)` in place, reading `x` through a broadcast view instead of writing the duplicate.

    Duplicate channel k = ((o * factor_t + a) * factor_s + b) * factor_s + d (a: frame, b: row, d: column offset)
    copies input channel k // repeats. Where `repeats` is the product of the trailing factors (the Wan2.2 stages:
    8 with time, 2 without), those offsets only broadcast one input channel, and the leading ones pick it; the sums
    are the same float adds as `out + duplicate_up(...)`.
    """
    b, c, t, h, w = x.shape
    out_dim = out.shape[1]
    factors = (factor_t, factor_s, factor_s)
    repeats = out_dim * factor_t * factor_s * factor_s // c
    trailing = [math.prod(factors[i:]) for i in range(len(factors) + 1)]
    trimmed = first_chunk and factor_t > 1
    if repeats not in trailing or (trimmed and t != 1):
        return out.add_(duplicate_up(x, out_dim, factor_t, factor_s, first_chunk))
    split = trailing.index(repeats)  # factors[split:] repeat one input channel, factors[:split] select it
    picked = [f if i < split else 1 for i, f in enumerate(factors)]
    source = x.view(b, out_dim, *picked, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)  # [b, o, t, a, h, b, w, d]
    if trimmed:  # the lone first frame keeps only the last of the factor_t duplicates
        source = source[:, :, :, -1:]
    out.view(b, out_dim, t, source.shape[3] if trimmed else factor_t, h, factor_s, w, factor_s).add_(source)
    return out


class ResidualDownStage(nn.Module):
    """Residual blocks and an optional downsample, plus the averaging shortcut over the whole stage."""

    def __init__(self, in_dim: int, out_dim: int, depth: int, down: bool, temporal: bool) -> None:
        super().__init__()
        dims = [in_dim] + [out_dim] * depth
        self.blocks = nn.ModuleList(ResidualBlock(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.down = Downsample(out_dim, temporal=temporal) if down else None
        self.out_dim = out_dim
        self.factor_t = 2 if temporal else 1
        self.factor_s = 2 if down else 1

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        shortcut = average_down(x, self.out_dim, self.factor_t, self.factor_s)
        for block in self.blocks:
            x = block(x, cache)
        if self.down is not None:
            x = self.down(x, cache)
        return x + shortcut


class ResidualUpStage(nn.Module):
    """Residual blocks and an optional (channel-keeping) upsample, plus the duplicating shortcut."""

    def __init__(self, in_dim: int, out_dim: int, depth: int, up: bool, temporal: bool) -> None:
        super().__init__()
        dims = [in_dim] + [out_dim] * depth
        self.blocks = nn.ModuleList(ResidualBlock(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.upsampler = Upsample(out_dim, temporal=temporal, out_dim=out_dim) if up else None
        self.out_dim = out_dim
        self.factor_t = 2 if temporal else 1

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        first_chunk = cache.chunks == 1
        stage_input = x
        for block in self.blocks:
            x = block(x, cache)
        if self.upsampler is None:
            return x
        # The upsampler's output is fresh, so the shortcut adds into it.
        return add_duplicate_up(self.upsampler(x, cache), stage_input, self.factor_t, 2, first_chunk)
