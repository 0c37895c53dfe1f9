"""Video-decoder convolutions on CPU through oneDNN at every size.

PyTorch routes a float32 CPU conv with batch 1, one group, a kernel no wider than 3 and a small input
(batch x channels x frames x rows <= 20480) to its native im2col kernel (`slow_conv3d`), a rule tuned for 2D
convs. For the 3x3x3 and 1x3x3 kernels of causal video decoders that rule picks the slower kernel: measured here
(2 cores, float32), oneDNN took 45 vs 61 ms at 64 channels x 5 x 18 x 18, 70 vs 134 ms at 32 x 11 x 34 x 34 and
101 vs 321 ms at 16 x 11 x 66 x 66. Larger inputs already go to oneDNN, so real video sizes do not change; kernels
of spatial size 1 keep PyTorch's choice (there the native kernel was faster). Results agree with the native kernel
to float32 rounding (a different summation order), and one conv layer always takes the same kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def conv3d(conv: nn.Conv3d, x: Tensor) -> Tensor:
    """`conv`'s own convolution of `x` (not its forward: a subclass may call this from there), through oneDNN
    where PyTorch would pick its native CPU kernel for a spatial kernel."""
    if (x.device.type == "cpu" and x.dtype == torch.float32 and conv.padding_mode == "zeros"
            and conv.kernel_size[1] * conv.kernel_size[2] > 1 and isinstance(conv.padding, tuple)
            and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
            and not torch.compiler.is_compiling() and not x.requires_grad):
        return torch.ops.aten.mkldnn_convolution(x, conv.weight, conv.bias, conv.padding, conv.stride,
                                                 conv.dilation, conv.groups)
    return nn.Conv3d._conv_forward(conv, x, conv.weight, conv.bias)
