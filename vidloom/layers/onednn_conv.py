"""Conv2d / Conv3d that run float32 CPU inference on oneDNN whatever the shape.

PyTorch routes a float32 CPU convolution to oneDNN only when it guesses oneDNN is faster: for a batch-1 input with a
kernel of at most 3x3 that means N * C * D * H (a 5D input) or N * C * H * W (4D) above 20,480 elements; below that
it takes its im2col "slow" kernels (aten::slow_conv3d_forward, _slow_conv2d_forward). That guess is wrong for the
convs of a VAE decoding one latent frame at a time: a Wan decoder conv of 32 channels over 3 frames of 128 x 128
(12,288 by that count) took 113 ms on the slow kernel and 9.7 ms on oneDNN, a 64 x 64 one 14 ms against 1.4 ms
(one thread, this repo's 2-core Xeon, bench/helios_decode.py). Both sides of the side-by-side report ran the slow
kernels (diffusers' AutoencoderKLWan calls F.conv3d too), so the Helios chunk decode was level with the reference.

Only float32 CPU inference (no grad) is rerouted: bfloat16 already goes to oneDNN where the CPU has bf16 matmul,
CUDA has its own choice, and autograd keeps the stock path. The outputs differ from the slow kernels' by float32
reordering only (a few ulps per conv; the Wan VAE parity tests bound the decode at 1e-4).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def onednn_applies(x: Tensor) -> bool:
    """Whether a conv on `x` is rerouted: float32 on the CPU, no autograd, oneDNN built in and enabled."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled()
            and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)


def conv_forward(conv: nn.Conv2d | nn.Conv3d, x: Tensor) -> Tensor:
    """`conv(x)`, on oneDNN where `onednn_applies(x)` (zero padding given as numbers; any other: the stock path)."""
    if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        return conv._conv_forward(x, conv.weight, conv.bias)
    return convolve(x, conv.weight, conv.bias, conv.padding, conv.stride, conv.dilation, conv.groups)


def convolve(x: Tensor, weight: Tensor, bias: Tensor | None, padding: Sequence[int], stride: Sequence[int],
             dilation: Sequence[int], groups: int = 1) -> Tensor:
    """A zero-padded convolution of `x` with a weight of its own rank, on oneDNN where `onednn_applies(x)`: the
    layers that convolve with a weight derived from a module's (a slice, a fold) take the same route as the module."""
    if not onednn_applies(x) or x.ndim != weight.ndim or weight.dtype != x.dtype:
        conv = F.conv3d if weight.ndim == 5 else F.conv2d
        return conv(x, weight, bias, tuple(stride), tuple(padding), tuple(dilation), groups)
    return torch.mkldnn_convolution(x, weight, bias, list(padding), list(stride), list(dilation), groups)


class Conv2d(nn.Conv2d):
    """nn.Conv2d (same parameters and state-dict keys) whose float32 CPU inference always runs on oneDNN."""

    def forward(self, x: Tensor) -> Tensor:
        return conv_forward(self, x)


class Conv3d(nn.Conv3d):
    """nn.Conv3d (same parameters and state-dict keys) whose float32 CPU inference always runs on oneDNN."""

    def forward(self, x: Tensor) -> Tensor:
        return conv_forward(self, x)
