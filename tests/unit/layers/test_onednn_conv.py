"""The oneDNN-routed convs: same results as nn.Conv2d / nn.Conv3d, and really on oneDNN for the small float32
inference shapes torch's own heuristic sends to its im2col kernels (the Wan VAE's per-frame decode)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import profile

from vidloom.layers.onednn_conv import Conv2d, Conv3d

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
# float32 reordering of the same sums (a 3x3x3 kernel over 8 channels): a few ulps of outputs of magnitude ~1.
TOL = 1e-5


def _kernels(fn) -> set[str]:
    with profile() as prof:
        fn()
    return {event.key for event in prof.key_averages()}


@pytest.mark.parametrize("stock_cls, ours_cls, shape, kwargs", [
    (nn.Conv3d, Conv3d, (1, 8, 3, 24, 20), dict(kernel_size=3, padding=(0, 1, 1))),
    (nn.Conv3d, Conv3d, (2, 8, 5, 12, 12), dict(kernel_size=(3, 1, 1), stride=(2, 1, 1))),
    (nn.Conv2d, Conv2d, (3, 8, 17, 13), dict(kernel_size=3, stride=2)),
    (nn.Conv2d, Conv2d, (1, 8, 16, 16), dict(kernel_size=1)),
], ids=["3d-k3", "3d-time-stride", "2d-stride", "2d-1x1"])
def test_matches_stock_conv_and_runs_on_onednn(stock_cls, ours_cls, shape, kwargs):
    torch.manual_seed(0)
    stock = stock_cls(8, 6, **kwargs)
    ours = ours_cls(8, 6, **kwargs)
    ours.load_state_dict(stock.state_dict())  # same parameter names
    x = torch.randn(shape)
    with torch.no_grad():
        expected = stock(x)
        assert (ours(x) - expected).abs().max().item() <= TOL
        channels_last = x.contiguous(memory_format=torch.channels_last_3d if x.ndim == 5 else torch.channels_last)
        assert (ours(channels_last) - expected).abs().max().item() <= TOL
        kernels = _kernels(lambda: ours(x))
    assert "aten::mkldnn_convolution" in kernels
    assert not any("slow_conv" in k for k in kernels)


def test_autograd_keeps_the_stock_path():
    torch.manual_seed(0)
    conv = Conv3d(4, 4, 3, padding=1)
    x = torch.randn(1, 4, 3, 8, 8, requires_grad=True)
    kernels = _kernels(lambda: conv(x).sum().backward())
    assert "aten::mkldnn_convolution" not in kernels
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_other_dtypes_keep_the_stock_path():
    conv = Conv2d(4, 4, 3, padding=1).double()
    with torch.no_grad():
        kernels = _kernels(lambda: conv(torch.randn(1, 4, 8, 8, dtype=torch.float64)))
    assert "aten::mkldnn_convolution" not in kernels
