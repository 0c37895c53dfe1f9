"""Linear + tanh-GELU in one oneDNN call: the same values as F.linear + F.gelu up to float32 rounding, really on
oneDNN for float32 CPU inference, and the stock path wherever something else must see the linear run (LoRA and
FP8 wrappers, autograd, bf16, hooks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import profile

from vidloom.layers.fp8 import FP8Linear
from vidloom.layers.fused_linear import fused_applies, linear_gelu_tanh
from vidloom.layers.sharded import mark_sharded
from vidloom.lora.apply import ActiveLoRAs, LoRALinear, lora_rows_scope, lora_scope
from vidloom.lora.files import LoRALayer
from vidloom.models.wan.transformer import MLP

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
# oneDNN's own GEMM blocking and GELU against aten's: float32 rounding of outputs of magnitude ~1.
TOL = 1e-5
FUSED_OP = "mkldnn::_linear_pointwise"


def _ops(fn) -> set[str]:
    with profile() as prof:
        fn()
    return {event.key for event in prof.key_averages()}


def _linear(bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(24, 40, bias=bias)


@pytest.mark.parametrize("shape, bias", [((7, 24), True), ((2, 9, 24), True), ((3, 5, 24), False)],
                         ids=["2d", "3d", "no-bias"])
def test_matches_unfused_and_runs_on_onednn(shape, bias):
    linear = _linear(bias)
    x = torch.randn(shape)
    with torch.inference_mode():
        expected = F.gelu(linear(x), approximate="tanh")
        got = linear_gelu_tanh(linear, x)
        assert FUSED_OP in _ops(lambda: linear_gelu_tanh(linear, x))
        strided = torch.randn(shape[-1], *shape[:-1]).movedim(0, -1)  # a non-contiguous input
        assert (linear_gelu_tanh(linear, strided) - F.gelu(linear(strided), approximate="tanh")).abs().max() <= TOL
    assert got.shape == expected.shape
    assert expected.abs().max() > 0.1
    assert (got - expected).abs().max().item() <= TOL


def test_wan_mlp_takes_it_only_for_tanh_gelu():
    torch.manual_seed(0)
    x = torch.randn(6, 16)
    tanh, silu = MLP(16, 32, 16, nn.GELU(approximate="tanh")), MLP(16, 32, 16, nn.SiLU())
    with torch.no_grad():
        assert (tanh(x) - tanh.down(F.gelu(tanh.up(x), approximate="tanh"))).abs().max() <= TOL
        assert FUSED_OP in _ops(lambda: tanh(x))
        assert FUSED_OP not in _ops(lambda: silu(x))


def test_stock_path_under_autograd_bf16_and_hooks():
    linear = _linear()
    x = torch.randn(4, 24, requires_grad=True)
    out = linear_gelu_tanh(linear, x)  # grad enabled: the stock path, so backward works
    out.sum().backward()
    assert x.grad is not None and not fused_applies(linear, x)
    with torch.no_grad():
        assert not fused_applies(linear.to(torch.bfloat16), x.detach().bfloat16())
        linear = _linear()
        seen = []
        linear.register_forward_hook(lambda module, args, output: seen.append(output.shape))
        assert not fused_applies(linear, x)
        linear_gelu_tanh(linear, x.detach())
        assert seen == [(4, 40)]


def test_sharded_modules_take_it_as_unsharded_ones_do():
    # A --shard-weights block runs with its whole weights gathered: the same call, so the same bits as one process
    # (tests/unit/runtime/parallel/test_shard_weights.py compares the outputs with torch.equal).
    block = nn.Sequential(_linear())
    mark_sharded(block, object())
    with torch.no_grad():
        assert fused_applies(block[0], torch.randn(3, 24))


def test_lora_adapters_and_fp8_weights_still_take_effect():
    linear, x = _linear(), torch.randn(5, 24)
    with torch.no_grad():
        before = linear_gelu_tanh(linear, x)
        lora = LoRALinear(linear, "t:proj")
        layer = LoRALayer(down=torch.randn(2, 24), up=torch.randn(40, 2), scaling=0.5)
        # No adapter active on it: the wrapper adds nothing, so its base runs fused, the same bits as unwrapped.
        assert torch.equal(linear_gelu_tanh(lora, x), before)
        assert FUSED_OP in _ops(lambda: linear_gelu_tanh(lora, x))
        with lora_scope(ActiveLoRAs({"t:other": ((layer, 1.0),)})):
            assert torch.equal(linear_gelu_tanh(lora, x), before)
        with lora_scope(ActiveLoRAs({"t:proj": ((layer, 0.8),)})):
            adapted = linear_gelu_tanh(lora, x)
            assert torch.equal(adapted, F.gelu(lora(x), approximate="tanh"))
            assert FUSED_OP not in _ops(lambda: linear_gelu_tanh(lora, x))
        assert (adapted - before).abs().max() > 0.1
        with lora_rows_scope([(ActiveLoRAs({"t:proj": ((layer, 0.8),)}), 2), (None, 3)]):
            assert not torch.equal(linear_gelu_tanh(lora, x), before)
        fp8 = FP8Linear.from_linear(_linear())
        assert not fused_applies(fp8, x)
        assert FUSED_OP not in _ops(lambda: linear_gelu_tanh(fp8, x))
        assert torch.equal(linear_gelu_tanh(fp8, x), F.gelu(fp8(x), approximate="tanh"))


def test_compiling_keeps_the_stock_calls(monkeypatch):
    # Inductor fuses linear + GELU itself and cannot lower the oneDNN op on a plain weight (a LoweringException).
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    linear = _linear()
    with torch.inference_mode():
        x = torch.randn(4, 24)
        assert FUSED_OP not in _ops(lambda: linear_gelu_tanh(linear, x))
        assert torch.equal(linear_gelu_tanh(linear, x), F.gelu(linear(x), approximate="tanh"))


def test_an_adapter_at_weight_zero_keeps_the_fused_base():
    torch.manual_seed(0)
    linear = _linear()
    lora = LoRALinear(linear, "t:up")
    layer = LoRALayer(down=torch.randn(4, 24), up=torch.randn(40, 4), scaling=1.0)
    with torch.inference_mode():
        x = torch.randn(5, 24)
        before = linear_gelu_tanh(linear, x)
        with lora_scope(ActiveLoRAs({"t:up": ((layer, 0.0),)})):
            assert FUSED_OP in _ops(lambda: linear_gelu_tanh(lora, x))
            assert torch.equal(linear_gelu_tanh(lora, x), before)
