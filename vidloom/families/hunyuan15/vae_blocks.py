"""Layers of the HunyuanVideo-1.5 causal video VAE (module and parameter names as diffusers'
AutoencoderKLHunyuanVideo15, so its checkpoints load unchanged).

Its resamples are DC-AE style: a conv computes the new resolution's values packed into channels, which are
unpacked into space (and time), plus a parameter-free shortcut that regroups the input the same way (channel
means going down, channel repeats going up). The first frame is never merged with others in time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import attention
from vidloom.models.wan.vae_blocks import RMSNorm


class CausalConv3d(nn.Module):
    """Kernel-3 conv over [B, C, T, H, W]; edges replicate, and time is padded in front only, so output frame t
    sees input frames <= t."""

    # F.pad order: (left, right, top, bottom, front, back).
    PAD = (1, 1, 1, 1, 2, 0)

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv3d(in_dim, out_dim, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, self.PAD, mode="replicate"))


def pack_space(x: Tensor, time: int) -> Tensor:
    """[B, C, time*T, 2H, 2W] -> [B, time*4*C, T, H, W]; channel index (dt, dy, dx, c), c fastest."""
    b, c, t, h, w = x.shape
    x = x.view(b, c, t // time, time, h // 2, 2, w // 2, 2).permute(0, 3, 5, 7, 1, 2, 4, 6)
    return x.reshape(b, time * 4 * c, t // time, h // 2, w // 2)


def unpack_space(x: Tensor, time: int) -> Tensor:
    """Inverse of pack_space: [B, time*4*C, T, H, W] -> [B, C, time*T, 2H, 2W]."""
    b, packed, t, h, w = x.shape
    c = packed // (time * 4)
    x = x.view(b, time, 2, 2, c, t, h, w).permute(0, 4, 5, 1, 6, 2, 7, 3)
    return x.reshape(b, c, t * time, h * 2, w * 2)


def group_mean(x: Tensor, channels: int) -> Tensor:
    """Average consecutive channel groups of [B, G*channels, ...] down to `channels`."""
    return x.view(x.shape[0], channels, x.shape[1] // channels, *x.shape[2:]).mean(dim=2)


class Downsample(nn.Module):
    """Halve height and width (with `temporal`, also the frames after the first) and go to `out_dim` channels."""

    def __init__(self, in_dim: int, out_dim: int, temporal: bool) -> None:
        super().__init__()
        self.temporal = temporal
        self.out_dim = out_dim
        self.conv = CausalConv3d(in_dim, out_dim // (8 if temporal else 4))

    def forward(self, x: Tensor) -> Tensor:
        # Order of operations as the reference, which parity needs (means and concatenations round alike).
        h = self.conv(x)
        if not self.temporal:
            return pack_space(h, 1) + group_mean(pack_space(x, 1), self.out_dim)
        # The lone first frame is packed over space only; its conv half is doubled to fill the channels.
        first = pack_space(h[:, :, :1], 1)
        h = torch.cat([torch.cat([first, first], dim=1), pack_space(h[:, :, 1:], 2)], dim=2)
        skip_first = group_mean(pack_space(x[:, :, :1], 1), self.out_dim)
        skip_rest = group_mean(pack_space(x[:, :, 1:], 2), self.out_dim)
        return h + torch.cat([skip_first, skip_rest], dim=2)


class Upsample(nn.Module):
    """Double height and width (with `temporal`, also the frames after the first) and go to `out_dim` channels."""

    def __init__(self, in_dim: int, out_dim: int, temporal: bool) -> None:
        super().__init__()
        factor = 8 if temporal else 4
        self.temporal = temporal
        self.out_dim = out_dim
        self.repeats = factor * out_dim // in_dim
        self.conv = CausalConv3d(in_dim, out_dim * factor)

    def forward(self, x: Tensor) -> Tensor:
        # Order of operations as the reference (the shortcut repeats before unpacking without time, after with it).
        h = self.conv(x)
        if not self.temporal:
            return unpack_space(h, 1) + unpack_space(x.repeat_interleave(self.repeats, dim=1), 1)
        # The first frame stays one frame: half of its unpacked conv channels are used.
        first = unpack_space(h[:, :, :1], 1)[:, : self.out_dim]
        h = torch.cat([first, unpack_space(h[:, :, 1:], 2)], dim=2)
        skip_first = unpack_space(x[:, :, :1], 1).repeat_interleave(self.repeats // 2, dim=1)
        skip_rest = unpack_space(x[:, :, 1:], 2).repeat_interleave(self.repeats, dim=1)
        return h + torch.cat([skip_first, skip_rest], dim=2)


class ResnetBlock(nn.Module):
    """Norm-SiLU-conv twice, plus a skip (a 1x1x1 conv when channels change)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.norm1 = RMSNorm(in_dim, spatial_dims=3)
        self.conv1 = CausalConv3d(in_dim, out_dim)
        self.norm2 = RMSNorm(out_dim, spatial_dims=3)
        self.conv2 = CausalConv3d(out_dim, out_dim)
        self.conv_shortcut = nn.Conv3d(in_dim, out_dim, 1) if in_dim != out_dim else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x), inplace=True))
        h = self.conv2(F.silu(self.norm2(h), inplace=True))
        return h + (x if self.conv_shortcut is None else self.conv_shortcut(x))


class CausalAttention(nn.Module):
    """Single-head attention over every pixel of a clip, each frame seeing itself and the frames before it."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, spatial_dims=3)
        self.to_q = nn.Conv3d(dim, dim, 1)
        self.to_k = nn.Conv3d(dim, dim, 1)
        self.to_v = nn.Conv3d(dim, dim, 1)
        self.proj_out = nn.Conv3d(dim, dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, frames, h, w = x.shape
        normed = self.norm(x)
        # [B, frames*h*w, 1 head, C], tokens frame-major.
        q, k, v = (proj(normed).flatten(2).transpose(1, 2).unsqueeze(2) for proj in (self.to_q, self.to_k, self.to_v))
        # The reference masks a full [N, N] score matrix block-causally; attending frame by frame to the keys
        # before it computes the same softmax without the mask (no N^2 memory, fused kernels stay usable).
        pixels = h * w
        out = torch.cat([attention(q[:, t * pixels : (t + 1) * pixels], k[:, : (t + 1) * pixels],
                                   v[:, : (t + 1) * pixels]) for t in range(frames)], dim=1)
        out = out.squeeze(2).transpose(1, 2).reshape(b, c, frames, h, w)
        return self.proj_out(out) + x


class MidBlock(nn.Module):
    """Resnet, causal attention, resnet: the bottleneck of both halves."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attentions = nn.ModuleList([CausalAttention(dim)])
        self.resnets = nn.ModuleList([ResnetBlock(dim, dim), ResnetBlock(dim, dim)])

    def forward(self, x: Tensor) -> Tensor:
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


class Stage(nn.Module):
    """Resnets at one resolution, then an optional resample, kept under diffusers' name for it
    (`downsamplers` / `upsamplers`, a one-entry list)."""

    def __init__(self, in_dim: int, out_dim: int, depth: int, resample_name: str, resample: nn.Module | None) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(ResnetBlock(in_dim if i == 0 else out_dim, out_dim) for i in range(depth))
        self.resample_name = resample_name
        setattr(self, resample_name, None if resample is None else nn.ModuleList([resample]))

    def forward(self, x: Tensor) -> Tensor:
        for resnet in self.resnets:
            x = resnet(x)
        resample = getattr(self, self.resample_name)
        return x if resample is None else resample[0](x)
