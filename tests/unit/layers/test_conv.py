"""layers.conv.conv3d: small video-decoder convs on CPU go through oneDNN, equal to PyTorch's own kernel."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from vidloom.layers.conv import conv3d
from vidloom.models.wan.vae_blocks import CausalConv3d


def _kernels(fn) -> set[str]:
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {event.key for event in prof.key_averages()}


@pytest.mark.parametrize("kernel, padding", [((3, 3, 3), (0, 1, 1)), ((1, 3, 3), (0, 1, 1)), ((3, 3, 3), (1, 1, 1))])
def test_a_small_spatial_kernel_runs_on_onednn_and_equals_the_native_kernel(kernel, padding):
    torch.manual_seed(0)
    conv = nn.Conv3d(16, 24, kernel, padding=padding)
    x = torch.randn(1, 16, 5, 12, 14)
    assert "aten::slow_conv3d_forward" in _kernels(lambda: conv(x))  # PyTorch's own pick at this size
    assert "aten::mkldnn_convolution" in _kernels(lambda: conv3d(conv, x))
    with torch.inference_mode():
        ours, native = conv3d(conv, x), conv(x)
    assert ours.shape == native.shape
    assert (ours - native).abs().max() <= 1e-5 * native.abs().max()


@pytest.mark.parametrize("case", ["time-only kernel", "replicate padding", "bfloat16"])
def test_other_convs_keep_pytorchs_choice_bit_for_bit(case):
    torch.manual_seed(0)
    conv = nn.Conv3d(8, 8, (3, 1, 1) if case == "time-only kernel" else 3, padding=1,
                     padding_mode="replicate" if case == "replicate padding" else "zeros")
    x = torch.randn(1, 8, 4, 6, 6)
    if case == "bfloat16":
        conv, x = conv.to(torch.bfloat16), x.to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(conv3d(conv, x), conv(x))


def test_the_wan_causal_conv_takes_it_from_its_own_forward():
    torch.manual_seed(0)
    conv = CausalConv3d(8, 8, 3, padding=1)
    x = torch.randn(1, 8, 3, 10, 10)
    assert "aten::mkldnn_convolution" in _kernels(lambda: conv(x))
    with torch.inference_mode():
        padded = torch.nn.functional.pad(x, (0, 0, 0, 0, 2, 0))
        native = nn.Conv3d.forward(conv, padded)
        assert (conv(x) - native).abs().max() <= 1e-5 * native.abs().max()
