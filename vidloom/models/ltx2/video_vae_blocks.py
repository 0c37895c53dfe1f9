"""Building blocks of the LTX-2 video VAE: causal 3D convs, RMS-normed residual blocks, space<->depth resamplers.

Module attribute names follow diffusers' `autoencoder_kl_ltx2.py` wherever the structure is the same, so
LTX2_VIDEO_VAE_NAME_MAP only renames what we restructure. The reshape/permute orders of the resamplers
follow that reference step by step: parity with its checkpoints depends on the exact channel layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.timestep import timestep_features

RMS_EPS = 1e-8  # diffusers PerChannelRMSNorm default, used by every LTX-2 VAE norm
TIME_FEATURES = 256  # PixArt-alpha timestep embedder width, used by the LTX-2 decoder's conditioning


def channel_rms_norm(x: Tensor) -> Tensor:
    """x / RMS over the channel axis, per voxel (no learned gain)."""
    return x / torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + RMS_EPS)


def spatial_noise(like: Tensor, generator: torch.Generator | None) -> Tensor:
    """One [H, W] standard-normal plane shared by all channels and frames (diffusers draws it that way).

    With `generator=None` the draw comes from torch's global RNG, which is what diffusers' decoder does.
    """
    shape = like.shape[-2:]
    if generator is not None and generator.device != like.device:
        return torch.randn(shape, generator=generator, device=generator.device, dtype=like.dtype).to(like.device)
    return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)


class CausalConv3d(nn.Module):
    """A 3D conv whose time padding repeats edge frames: the first frame only (causal) or both ends."""

    def __init__(self, cin: int, cout: int, stride: tuple[int, int, int] = (1, 1, 1), padding_mode: str = "zeros") -> None:
        super().__init__()
        self.time_kernel = 3
        self.conv = nn.Conv3d(cin, cout, 3, stride=stride, padding=(0, 1, 1), padding_mode=padding_mode)

    def forward(self, x: Tensor, causal: bool) -> Tensor:
        pad = self.time_kernel - 1
        if causal:
            x = torch.cat([x[:, :, :1].repeat(1, 1, pad, 1, 1), x], dim=2)
        else:
            half = pad // 2
            x = torch.cat([x[:, :, :1].repeat(1, 1, half, 1, 1), x, x[:, :, -1:].repeat(1, 1, half, 1, 1)], dim=2)
        return self.conv(x)


class TimestepMLP(nn.Module):
    """Sinusoidal timestep features -> Linear -> SiLU -> Linear (diffusers' PixArt-alpha timestep embedder)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(TIME_FEATURES, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, timestep: Tensor, dtype: torch.dtype) -> Tensor:
        features = timestep_features(timestep.flatten(), TIME_FEATURES).to(dtype)
        return self.linear_2(F.silu(self.linear_1(features)))


class ResnetBlock(nn.Module):
    """RMS-norm -> SiLU -> conv, twice, plus a (LayerNorm + 1x1 conv) shortcut when the width changes.

    Optional per-channel noise after each conv (`inject_noise`) and timestep scale/shift after each norm
    (`timestep_conditioning`, driven by a [B, 4*C, 1, 1, 1] embedding from the enclosing block).
    """

    def __init__(self, cin: int, cout: int, eps: float, padding_mode: str, inject_noise: bool = False,
                 timestep_conditioning: bool = False) -> None:
        super().__init__()
        self.conv1 = CausalConv3d(cin, cout, padding_mode=padding_mode)
        self.conv2 = CausalConv3d(cout, cout, padding_mode=padding_mode)
        self.norm3 = nn.LayerNorm(cin, eps=eps) if cin != cout else None
        self.conv_shortcut = nn.Conv3d(cin, cout, 1) if cin != cout else None
        self.per_channel_scale1 = nn.Parameter(torch.zeros(cin, 1, 1)) if inject_noise else None
        self.per_channel_scale2 = nn.Parameter(torch.zeros(cin, 1, 1)) if inject_noise else None
        self.scale_shift_table = nn.Parameter(torch.randn(4, cin) / cin**0.5) if timestep_conditioning else None

    def forward(self, x: Tensor, temb: Tensor | None, generator: torch.Generator | None, causal: bool) -> Tensor:
        h = channel_rms_norm(x)
        if self.scale_shift_table is not None:
            assert temb is not None, "a timestep-conditioned block needs its embedding"
            mods = temb.unflatten(1, (4, -1)) + self.scale_shift_table[None, :, :, None, None, None]
            shift1, scale1, shift2, scale2 = mods.unbind(dim=1)
            h = h * (1 + scale1) + shift1
        h = self.conv1(F.silu(h), causal)
        if self.per_channel_scale1 is not None:
            h = h + (spatial_noise(h, generator)[None] * self.per_channel_scale1)[None, :, None]
        h = channel_rms_norm(h)
        if self.scale_shift_table is not None:
            h = h * (1 + scale2) + shift2
        h = self.conv2(F.silu(h), causal)
        if self.per_channel_scale2 is not None:
            h = h + (spatial_noise(h, generator)[None] * self.per_channel_scale2)[None, :, None]
        if self.norm3 is not None:
            x = self.norm3(x.movedim(1, -1)).movedim(-1, 1)
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return h + x


def _space_to_depth(x: Tensor, stride: tuple[int, int, int]) -> Tensor:
    """[B, C, F*s0, H*s1, W*s2] -> [B, C*s0*s1*s2, F, H, W], channel order (c, s0, s1, s2) as diffusers."""
    x = x.unflatten(4, (-1, stride[2])).unflatten(3, (-1, stride[1])).unflatten(2, (-1, stride[0]))
    return x.permute(0, 1, 3, 5, 7, 2, 4, 6).flatten(1, 4)


def _depth_to_space(x: Tensor, stride: tuple[int, int, int]) -> Tensor:
    """Inverse of `_space_to_depth`: [B, C*s0*s1*s2, F, H, W] -> [B, C, F*s0, H*s1, W*s2]."""
    b, _, f, h, w = x.shape
    x = x.reshape(b, -1, *stride, f, h, w)
    return x.permute(0, 1, 5, 2, 6, 3, 7, 4).flatten(6, 7).flatten(4, 5).flatten(2, 3)


class Downsampler(nn.Module):
    """Conv then space-to-depth, plus a parameter-free residual (space-to-depth, then group means)."""

    def __init__(self, cin: int, cout: int, stride: tuple[int, int, int], padding_mode: str) -> None:
        super().__init__()
        self.stride = stride
        volume = stride[0] * stride[1] * stride[2]
        self.group_size = cin * volume // cout
        self.conv = CausalConv3d(cin, cout // volume, padding_mode=padding_mode)

    def forward(self, x: Tensor, causal: bool) -> Tensor:
        # Repeating the first frame(s) makes 1 + s0*k frames divide evenly in time.
        x = torch.cat([x[:, :, : self.stride[0] - 1], x], dim=2)
        residual = _space_to_depth(x, self.stride).unflatten(1, (-1, self.group_size)).mean(dim=2)
        return _space_to_depth(self.conv(x, causal), self.stride) + residual


class Upsampler(nn.Module):
    """Conv then depth-to-space (dropping the s0-1 leading frames), plus an optional repeated-channel residual."""

    def __init__(self, cin: int, stride: tuple[int, int, int], residual: bool, factor: int, padding_mode: str) -> None:
        super().__init__()
        self.stride = stride
        self.residual = residual
        self.factor = factor
        volume = stride[0] * stride[1] * stride[2]
        self.conv = CausalConv3d(cin, cin * volume // factor, padding_mode=padding_mode)

    def forward(self, x: Tensor, causal: bool) -> Tensor:
        trim = self.stride[0] - 1
        out = _depth_to_space(self.conv(x, causal), self.stride)[:, :, trim:]
        if self.residual:
            volume = self.stride[0] * self.stride[1] * self.stride[2]
            shortcut = _depth_to_space(x, self.stride).repeat(1, volume // self.factor, 1, 1, 1)
            out = out + shortcut[:, :, trim:]
        return out
