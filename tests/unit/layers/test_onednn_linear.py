"""The fused linear + tanh-GELU: the stock result within float32 ulps, one oneDNN call on float32 CPU inference,
and the two stock calls for everything it must not touch (autograd, other dtypes, other linear classes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import profile

from vidloom.layers.onednn_linear import linear_gelu_tanh

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
# Another GEMM's summation order and GELU approximation: a few float32 ulps of outputs of magnitude ~10.
TOL = 2e-5


def _kernels(fn) -> set[str]:
    with profile() as prof:
        fn()
    return {event.key for event in prof.key_averages()}


def _stock(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.gelu(linear(x), approximate="tanh")


@pytest.mark.parametrize("shape, bias", [((1, 37, 64), True), ((3, 5, 64), False), ((9, 64), True)],
                         ids=["one-sample", "batch-no-bias", "2d"])
def test_matches_stock_and_runs_as_one_onednn_call(shape, bias):
    torch.manual_seed(0)
    linear = nn.Linear(64, 256, bias=bias)
    x = torch.randn(shape) * 3
    with torch.inference_mode():
        ours = linear_gelu_tanh(linear, x)
        assert ours.shape == (*shape[:-1], 256)
        assert (ours - _stock(linear, x)).abs().max().item() <= TOL
        kernels = _kernels(lambda: linear_gelu_tanh(linear, x))
    assert "mkldnn::_linear_pointwise" in kernels
    assert "aten::gelu" not in kernels and "aten::addmm" not in kernels


def test_autograd_other_dtypes_and_hooked_linears_keep_the_stock_calls():
    torch.manual_seed(0)
    linear = nn.Linear(16, 32)
    x = torch.randn(4, 16, requires_grad=True)
    assert "mkldnn::_linear_pointwise" not in _kernels(lambda: linear_gelu_tanh(linear, x).sum().backward())
    assert x.grad is not None and x.grad.abs().sum() > 0
    with torch.inference_mode():
        double = nn.Linear(16, 32).double()
        assert "mkldnn::_linear_pointwise" not in _kernels(lambda: linear_gelu_tanh(double, x.detach().double()))
        seen = []
        linear.register_forward_hook(lambda module, args, out: seen.append(out.shape))
        assert torch.equal(linear_gelu_tanh(linear, x.detach()), _stock(linear, x.detach()))
        assert seen  # the hook ran: the module was called, not bypassed


def test_compiling_keeps_the_stock_calls(monkeypatch):
    # Inductor fuses linear + GELU itself and cannot lower the oneDNN op on a plain weight (a LoweringException).
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    linear = nn.Linear(16, 32)
    with torch.inference_mode():
        x = torch.randn(4, 16)
        assert "mkldnn::_linear_pointwise" not in _kernels(lambda: linear_gelu_tanh(linear, x))
        assert torch.equal(linear_gelu_tanh(linear, x), _stock(linear, x))
