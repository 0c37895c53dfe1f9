"""The tanh-GELU MLPs that take layers.fused_linear's one oneDNN call: SANA-WM's MLP (caption projection, "mlp"
FFN), HunyuanVideo-1.5's dual-stream block MLP, the Qwen-Omni speech DiT's block and LTX-2's caption projection.
In float32 CPU inference each equals its stock F.linear + F.gelu path (fused_applies patched off) within float32
rounding while the oneDNN op runs; an active LoRA adapter or FP8 weights on the up-projection keep their own
forward and take effect (the stock path, bit for bit)."""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

import pytest
import torch
from torch import Tensor, nn
from torch.profiler import profile

from tests.unit.layers.test_fused_linear import FUSED_OP, TOL
from vidloom.families.hunyuan15.layers import MLP as HunyuanMLP
from vidloom.families.hunyuan15.layers import DualStreamBlock
from vidloom.families.qwen_omni.config import DiTConfig
from vidloom.families.qwen_omni.demo import DIT
from vidloom.families.qwen_omni.dit import DiTBlock
from vidloom.families.sana_wm.transformer import MLP as SanaMLP
from vidloom.layers import fused_linear
from vidloom.layers.attention import attention
from vidloom.layers.fp8 import FP8Linear
from vidloom.lora.apply import ActiveLoRAs, LoRALinear, lora_scope
from vidloom.lora.files import LoRALayer
from vidloom.models.ltx2.layers import CaptionProjection

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")

# A case: the module, a call running it on fixed inputs, the module holding one fused up-projection, its name.
Case = tuple[nn.Module, Callable[[], Tensor], nn.Module, str]
# How many tanh-GELU up-projections a case runs (Hunyuan's block: its video and its condition stream's MLPs).
FUSED_CALLS = {"hunyuan15": 2}


def _sana() -> Case:
    mlp = SanaMLP(16, 40, 24)
    x = torch.randn(2, 7, 16)
    return mlp, lambda: mlp(x), mlp, "fc1"


def _hunyuan() -> Case:
    block = DualStreamBlock(32, 8, 4.0, attention)
    h, temb = torch.randn(2, 9, 32), torch.randn(2, 32)  # 6 video tokens, 3 condition tokens
    cos, sin = torch.randn(6, 8), torch.randn(6, 8)
    return block, lambda: block(h, 6, temb, None, (cos, sin), torch.float32), block.video.mlp, "up"


def _qwen_omni() -> Case:
    config = DiTConfig.from_raw(DIT)
    block = DiTBlock(config, look_back=1, look_ahead=0)
    frames = 30
    x, t_emb = torch.randn(2, frames, config.hidden_size), torch.randn(2, config.hidden_size)
    angles = torch.randn(1, frames, config.head_dim)
    blocks = torch.arange(frames) // config.block_size
    run = lambda: block(x, t_emb, (angles.cos(), angles.sin()), blocks[None, :] - blocks[:, None])  # noqa: E731
    return block, run, block, "ff1"


def _ltx2() -> Case:
    caption = CaptionProjection(16, 32)
    x = torch.randn(2, 5, 16)
    return caption, lambda: caption(x), caption, "0"


CASES = {"sana_wm": _sana, "hunyuan15": _hunyuan, "qwen_omni": _qwen_omni, "ltx2_caption": _ltx2}


def _build(name: str) -> Case:
    torch.manual_seed(0)
    module, run, parent, attr = CASES[name]()
    with torch.no_grad():  # non-zero biases and output scales, so a skipped term would show
        for param in module.parameters():
            param.normal_(0.0, 0.3)
    return module.eval(), run, parent, attr


def _fused_calls(fn: Callable[[], object]) -> int:
    with profile() as prof:
        fn()
    return sum(event.count for event in prof.key_averages() if event.key == FUSED_OP)


def _stock(run: Callable[[], Tensor]) -> Tensor:
    with mock.patch.object(fused_linear, "fused_applies", lambda *args: False):
        return run()


def _matches_stock(name: str, got: Tensor, run: Callable[[], Tensor]) -> bool:
    """`got` with one up-projection unfused against the stock path: the same bits where that was the only fused
    call, float32 rounding where another still runs fused (Hunyuan's other stream)."""
    stock = _stock(run)
    if FUSED_CALLS.get(name, 1) == 1:
        return torch.equal(got, stock)
    return (got - stock).abs().max().item() <= TOL * max(1.0, stock.abs().max().item())


@pytest.mark.parametrize("name", CASES)
def test_fused_path_runs_and_matches_the_stock_path(name):
    _, run, _, _ = _build(name)
    with torch.inference_mode():
        fused, stock = run(), _stock(run)
        assert _fused_calls(run) == FUSED_CALLS.get(name, 1)
        assert _fused_calls(lambda: _stock(run)) == 0
    assert stock.abs().max() > 0.1
    assert (fused - stock).abs().max().item() <= TOL * max(1.0, stock.abs().max().item())


@pytest.mark.parametrize("name", CASES)
def test_lora_and_fp8_up_projections_keep_their_forward(name):
    module, run, parent, attr = _build(name)
    up = getattr(parent, attr)
    with torch.inference_mode():
        before = run()
        lora = LoRALinear(up, "t:up")
        setattr(parent, attr, lora)
        layer = LoRALayer(down=torch.randn(2, up.in_features), up=torch.randn(up.out_features, 2), scaling=0.5)
        assert torch.equal(run(), before)  # no adapter active: the base, fused, the same bits
        with lora_scope(ActiveLoRAs({"t:up": ((layer, 0.8),)})):
            adapted = run()
            assert _fused_calls(run) == FUSED_CALLS.get(name, 1) - 1  # the adapted linear runs its wrapper
            assert _matches_stock(name, adapted, run)
        assert (adapted - before).abs().max() > 1e-3
        setattr(parent, attr, FP8Linear.from_linear(up))
        quantized = run()
        assert _fused_calls(run) == FUSED_CALLS.get(name, 1) - 1
        assert _matches_stock(name, quantized, run)
        assert not torch.equal(quantized, before)  # the FP8 weights took effect


def test_hunyuan_refiner_silu_mlp_stays_two_calls():
    torch.manual_seed(0)
    mlp = HunyuanMLP(16, 4.0, tanh_gelu=False)
    with torch.inference_mode():
        x = torch.randn(3, 16)
        assert _fused_calls(lambda: mlp(x)) == 0
        assert torch.equal(mlp(x), mlp.down(torch.nn.functional.silu(mlp.up(x))))
