"""Nearest 2x upsampling followed by a 3x3 convolution (padding 1), computed on the low-resolution input.

After a nearest 2x upsample every 2 x 2 block of the image repeats one input pixel, so along each axis the
3 taps of the kernel land on only two input pixels: output 2i (phase 0) reads input i-1 (tap 0) and i (taps 1 and
2), output 2i+1 (phase 1) reads i (taps 0 and 1) and i+1 (tap 2). Summing the taps that share a pixel turns the 3x3
kernel into four 2x2 kernels, one per output phase, applied to the input itself: 16 multiply-adds per output pixel
where the upsampled conv does 36, and the 4x larger upsampled image is never written. The four phases run as one conv
of 4x the output channels; their outputs are interleaved into the 2x image in one copy. The result equals upsample +
conv up to float rounding (the tap sums are rounded once, in float32).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vidloom.layers.onednn_conv import convolve


def _fold_taps(weight: Tensor, axis: int) -> tuple[Tensor, Tensor]:
    """The 3 taps of `weight` along `axis` as 2 taps per output phase: (t0, t1 + t2) and (t0 + t1, t2)."""
    t0, t1, t2 = weight.unbind(axis)
    return torch.stack((t0, t1 + t2), axis), torch.stack((t0 + t1, t2), axis)


def phase_weights(weight: Tensor) -> Tensor:
    """[O, I, 3, 3] -> [4 * O, I, 2, 2]: the kernels of output phases (0, 0), (0, 1), (1, 0), (1, 1) stacked."""
    wide = weight.float()  # half-precision weights are summed in float32 and rounded once
    phases = [col for row in _fold_taps(wide, 2) for col in _fold_taps(row, 3)]
    folded = torch.cat(phases, 0).to(weight.dtype)
    layout = torch.channels_last if weight.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    return folded.contiguous(memory_format=layout)


def upsample2x_conv3x3(x: Tensor, conv: nn.Conv2d) -> Tensor:
    """`conv(F.interpolate(x, scale_factor=2, mode="nearest"))` for a 3x3, padding-1, stride-1 `conv`, from the
    low-resolution `x` [N, C, h, w] -> [N, O, 2h, 2w] (the layout of `x`)."""
    if (conv.kernel_size != (3, 3) or conv.padding != (1, 1) or conv.stride != (1, 1) or conv.dilation != (1, 1)
            or conv.groups != 1 or conv.padding_mode != "zeros"):
        raise ValueError(f"upsample2x_conv3x3 needs a 3x3 conv with padding 1, stride 1; got {conv}")
    n, _, h, w = x.shape
    out_ch = conv.out_channels
    bias = None if conv.bias is None else conv.bias.repeat(4)
    # Padding 1 with a 2x2 kernel gives (h + 1) x (w + 1) outputs per phase: phase 0 reads rows (i - 1, i) at
    # output row i, phase 1 rows (i, i + 1) at output row i + 1, so each phase starts at its own offset.
    y = convolve(x, phase_weights(conv.weight), bias, (1, 1), (1, 1), (1, 1))
    layout = torch.channels_last if y.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    out = torch.empty((n, out_ch, 2 * h, 2 * w), dtype=y.dtype, device=y.device, memory_format=layout)
    # out[n, o, 2i + dy, 2j + dx] = y[n, (2 dy + dx) O + o, i + dy, j + dx]: one strided view of y, whatever its layout.
    sn, sc, sh, sw = y.stride()
    phases = y.as_strided((n, out_ch, h, 2, w, 2), (sn, sc, sh, sh + 2 * out_ch * sc, sw, sw + out_ch * sc),
                          y.storage_offset())
    out.view(n, out_ch, h, 2, w, 2).copy_(phases)
    return out
