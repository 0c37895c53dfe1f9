"""Nearest 2x upsample + 3x3 conv computed as four 2x2 phase convs on the low-resolution input: the same image as
upsampling first (up to float rounding of the folded taps), in either memory layout and precision."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vidloom.layers.onednn_conv import Conv2d
from vidloom.layers.upsample_conv import phase_weights, upsample2x_conv3x3

# float32: the folded taps round once more than the per-tap products (a few ulps of outputs of magnitude ~2).
TOL = 1e-5


@pytest.mark.parametrize("conv_cls", [nn.Conv2d, Conv2d])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", [(2, 6, 7, 9), (1, 6, 1, 1), (3, 6, 4, 2)])
def test_equals_upsampling_then_convolving(conv_cls, channels_last, shape):
    torch.manual_seed(0)
    conv = conv_cls(6, 5, 3, padding=1)
    x = torch.randn(shape)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
        conv.weight.data = conv.weight.data.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = conv(F.interpolate(x, scale_factor=2.0, mode="nearest-exact"))
        got = upsample2x_conv3x3(x, conv)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= TOL
    assert got.is_contiguous(memory_format=torch.channels_last) == channels_last


def test_bfloat16_stays_within_one_rounding():
    torch.manual_seed(0)
    conv = Conv2d(6, 5, 3, padding=1).to(torch.bfloat16)
    x = torch.randn(2, 6, 5, 5, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = conv(F.interpolate(x, scale_factor=2.0, mode="nearest-exact")).float()
        got = upsample2x_conv3x3(x, conv)
    assert got.dtype is torch.bfloat16
    # bf16 keeps 8 bits of mantissa: outputs below 4 in magnitude round at 2^-6.
    assert (got.float() - expected).abs().max().item() <= 2 ** -5


def test_phase_weights_sum_the_taps_that_share_a_pixel():
    weight = torch.arange(9.0).view(1, 1, 3, 3)
    folded = phase_weights(weight)
    assert folded.shape == (4, 1, 2, 2)
    # Phase (0, 0): rows (t0, t1 + t2), columns likewise; the total of every phase is the whole kernel's.
    assert folded[0, 0].tolist() == [[0.0, 1.0 + 2.0], [3.0 + 6.0, 4.0 + 5.0 + 7.0 + 8.0]]
    assert folded.sum(dim=(1, 2, 3)).tolist() == [36.0] * 4


@pytest.mark.parametrize("kwargs", [dict(kernel_size=3, padding=0), dict(kernel_size=1), dict(kernel_size=3, padding=1,
                                                                                              stride=2)])
def test_other_convs_are_refused(kwargs):
    with pytest.raises(ValueError, match="3x3 conv with padding 1"):
        upsample2x_conv3x3(torch.randn(1, 4, 4, 4), nn.Conv2d(4, 4, **kwargs))
