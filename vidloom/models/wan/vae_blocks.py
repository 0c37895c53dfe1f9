"""Layers of the Wan2.1 video VAE, with causal time handling driven by a per-call cache."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import attention
from vidloom.layers.onednn_conv import Conv2d, Conv3d, conv2d_forward

# A kernel-3 causal conv needs the two frames before a chunk to produce the chunk's
# first outputs exactly as if the whole video had been convolved at once.
HISTORY_FRAMES = 2
NORM_EPS = 1e-12  # F.normalize's default, which the reference uses


class CausalCache:
    """Stream state of one encode or decode call: the input tail each causal layer saw last.

    The network is run chunk by chunk along time. Every chunk walks the layers in the
    same order, so the n-th slot claimed within a chunk always belongs to the same
    layer; that lets the state live here, created per call, instead of on the modules
    (which may then be shared by concurrent calls).
    """

    def __init__(self) -> None:
        self._tails: list[Tensor | None] = []
        self._cursor = 0
        self.chunks = 0  # chunks begun so far; 1 while the first is running
        self.last = False  # the running chunk is the call's last: no layer stores a tail for a next one

    def begin_chunk(self, last: bool = False) -> None:
        """Rewind to the first layer before feeding the next chunk through the network; `last`: nothing follows
        it (a one-frame decode's only chunk), so the layers skip copying their input tails."""
        self._cursor = 0
        self.chunks += 1
        self.last = last

    def claim(self) -> int:
        """Slot of the next stateful layer in call order; None-filled on the first chunk."""
        slot = self._cursor
        self._cursor += 1
        if slot == len(self._tails):
            self._tails.append(None)
        return slot

    def get(self, slot: int) -> Tensor | None:
        """What the layer in `slot` stored on the previous chunk (None on the first)."""
        return self._tails[slot]

    def put(self, slot: int, tail: Tensor) -> None:
        """Store the state the layer in `slot` needs for the next chunk."""
        self._tails[slot] = tail

    def stream(self, conv: CausalConv3d, x: Tensor) -> Tensor:
        """Apply `conv` to the next chunk `x`, continuing from the frames it saw before."""
        slot = self.claim()
        past = self.get(slot)
        if not self.last:
            self.put(slot, stream_tail(past, x))
        return conv(x, past)


def stream_tail(past: Tensor | None, x: Tensor) -> Tensor:
    """Last HISTORY_FRAMES frames of the stream `past` followed by `x` (fewer near its start)."""
    if past is not None and x.shape[2] < HISTORY_FRAMES:
        x = torch.cat([past, x], dim=2)
    # Copy so the cache does not pin the whole chunk's activations in memory.
    return x[:, :, -HISTORY_FRAMES:].clone()


class CausalConv3d(Conv3d):
    """3D conv whose output frame t depends only on input frames <= t.

    Height and width are zero-padded inside the conv kernel (no padded copy of the input); only
    the time padding, which comes from the previous chunk's frames, is concatenated in front.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int, int],
        padding: int | tuple[int, int, int] = 0,
    ) -> None:
        pad_t, pad_h, pad_w = (padding,) * 3 if isinstance(padding, int) else padding
        super().__init__(in_channels, out_channels, kernel_size, padding=(0, pad_h, pad_w))
        # All the time padding goes before the first frame (twice the symmetric amount)
        # so the receptive field never reaches forward in time.
        self._time_pad = 2 * pad_t

    def forward(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        """Convolve `x`, taking the frames before it from `past` instead of zeros."""
        if x.shape[2] == 1 and (past is None or past.shape[2] == 0) and self._first_frame_is_2d():
            return self._last_tap(x)
        missing = self._time_pad
        if past is not None and missing > 0:
            x = torch.cat([past, x], dim=2)
            missing -= past.shape[2]
        if missing > 0:
            x = F.pad(x, (0, 0, 0, 0, missing, 0))
        return super().forward(x)


    def _first_frame_is_2d(self) -> bool:
        """A lone frame with nothing before it: every time tap but the last reads the zero padding."""
        return (self._time_pad == self.kernel_size[0] - 1 and self.stride[0] == 1 and self.dilation[0] == 1
                and self.padding_mode == "zeros")

    def _last_tap(self, x: Tensor) -> Tensor:
        """The conv of one frame [B, C, 1, H, W] whose time padding is all zeros, as the 2D conv of the kernel's
        last time tap: what the first chunk of every decode and encode (a Qwen-Image decode's only chunk) runs.
        The same sums without the zero products (a time-kernel-3 conv is a third of the work; the padded copy of
        the input goes too); float32 ulps from the 3D conv's summation order."""
        weight = self.weight[:, :, -1].contiguous(memory_format=torch.channels_last)  # a slice of the 3D weight
        y = conv2d_forward(x[:, :, 0], weight, self.bias, self.stride[1:], self.padding[1:], self.dilation[1:],
                           self.groups)
        return y.unsqueeze(2)


class RMSNorm(nn.Module):
    """Wan's "RMS norm": L2-normalise over channels, then scale by sqrt(dim) and a learned gain."""

    def __init__(self, dim: int, spatial_dims: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim, *(1,) * spatial_dims))
        self.scale = dim**0.5

    def forward(self, x: Tensor) -> Tensor:
        # x * (sqrt(dim) / max(|x|, eps)) * gamma: one pass fewer than normalise-then-scale. CPU and CUDA
        # reductions accumulate bfloat16 in float32, so bf16 needs no float32 copy of x; float16 would
        # overflow the sum of squares and is widened.
        wide = torch.float32 if x.dtype == torch.float16 else None
        norm = torch.linalg.vector_norm(x, dim=1, keepdim=True, dtype=wide)
        inv = (self.scale / norm.clamp_min(NORM_EPS)).to(x.dtype)
        return (x * inv).mul_(self.gamma)


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
        # The norms return fresh tensors, so SiLU runs in place on them (one allocation fewer).
        h = cache.stream(self.conv1, F.silu(self.norm1(x), inplace=True))
        # Dropout is a no-op at inference, so it is left out.
        h = cache.stream(self.conv2, F.silu(self.norm2(h), inplace=True))
        return h + skip


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
        return per_frame(x, lambda f: self.spatial(_nearest_2x(f)))

    def _double_frames(self, x: Tensor, cache: CausalCache) -> Tensor:
        slot = cache.claim()
        past = cache.get(slot)
        if past is None:
            # The first latent frame stands for one video frame, not two; later chunks
            # start this conv's stream from zero history (an empty tail).
            cache.put(slot, x[:, :, :0])
            return x
        if not cache.last:
            cache.put(slot, stream_tail(past, x))
        y = self.temporal(x, past)
        b, c, t, h, w = x.shape
        # The two channel halves are consecutive output frames; interleave them in time.
        return y.view(b, 2, c, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c, t * 2, h, w)


def _nearest_2x(frames: Tensor) -> Tensor:
    """Nearest 2x upsampling of [N, C, H, W] into a channels-last result (each pixel repeated 2 x 2: exactly
    F.interpolate's nearest-exact at scale 2, whose source pixel of output i is floor((i + 0.5) / 2) = i // 2).

    Written as one broadcast copy because F.interpolate picks its layout from the input's strides, and a frame
    view of a one-frame chunk can carry a batch stride that does not read as channels-last: it then wrote NCHW,
    which cost 47 ms instead of 2 ms at 64 x 128 x 128 (one thread) and a reorder in the next conv."""
    n, c, h, w = frames.shape
    out = torch.empty((n, h, 2, w, 2, c), dtype=frames.dtype, device=frames.device)
    out.copy_(frames.permute(0, 2, 3, 1)[:, :, None, :, None].expand(n, h, 2, w, 2, c))
    return out.view(n, 2 * h, 2 * w, c).permute(0, 3, 1, 2)
