"""GGUFLinear and the GGUF weight loader: quantized linears swapped in on meta, the rest dequantized."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.gguf_files import random_blocks, write_gguf
from vidloom.core.errors import CheckpointError
from vidloom.layers.gguf_linear import GGUFLinear, install_quantized
from vidloom.layers.quantized_weight import QuantizedWeight
from vidloom.loading.gguf_file import read_gguf
from vidloom.loading.component_file import load_component_file
from vidloom.loading.name_map import NameMap
from vidloom.loading.precision import materialize
from vidloom.lora.apply import ActiveLoRAs, lora_scope, wrap_linears
from vidloom.lora.files import LoRALayer


def _weight(rows: int = 8, qtype: str = "Q4_K", seed: int = 0) -> QuantizedWeight:
    blocks = random_blocks(qtype, rows, seed=seed)  # one 256-value block per row
    return QuantizedWeight(torch.from_numpy(blocks), qtype, (rows, 256))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(256, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 256, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.proj(x)))


def test_forward_is_the_dequantized_linear() -> None:
    weight, bias = _weight(), torch.randn(8)
    layer = GGUFLinear(weight, bias, torch.float32)
    x = torch.randn(3, 256)
    torch.testing.assert_close(layer(x), F.linear(x, weight.dequantize(), bias), rtol=0, atol=0)
    assert layer(x.bfloat16()).dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    assert [name for name, _ in layer.named_buffers()] == ["packed"]


def test_install_swaps_the_owning_linear_and_refuses_the_rest() -> None:
    model = Tiny()
    layer = install_quantized(model, "proj.weight", _weight(), torch.float32)
    assert model.proj is layer and layer.bias is not None
    with pytest.raises(CheckpointError, match=r"'norm\.weight' is quantized, but it is not the weight of a Linear"):
        install_quantized(model, "norm.weight", _weight(), torch.float32)
    with pytest.raises(CheckpointError, match=r"'head\.weight' has shape \(8, 256\), Tiny\.head expects \(256, 8\)"):
        install_quantized(model, "head.weight", _weight(), torch.float32)
    with pytest.raises(CheckpointError, match=r"no module 'missing'"):
        install_quantized(model, "missing.weight", _weight(), torch.float32)


def test_component_file_keeps_linears_quantized_and_dequantizes_the_rest(tmp_path: Path) -> None:
    reference = Tiny()
    with torch.no_grad():
        reference.norm.weight.normal_()
    state = {**reference.state_dict(), "table": torch.randn(2, 64)}  # a quantized non-Linear tensor
    path = write_gguf(tmp_path / "tiny.gguf", state, "Q8_0", quantize_also=("table",))
    tensors = read_gguf(path)
    model = materialize(Tiny, torch.device("cpu"), torch.float32)
    model.register_parameter("table", nn.Parameter(torch.empty(2, 64)))
    load_component_file(model, path, NameMap(()))
    assert isinstance(model.proj, GGUFLinear) and isinstance(model.head, nn.Linear)  # 8 values a row: kept F16
    expected = F.linear(torch.ones(1, 256), tensors["proj.weight"].dequantize(), reference.proj.bias)
    torch.testing.assert_close(model.proj(torch.ones(1, 256)), expected, rtol=0, atol=0)
    torch.testing.assert_close(model.norm.weight, reference.norm.weight, rtol=0, atol=0)
    torch.testing.assert_close(model.table, tensors["table"].dequantize(), rtol=0, atol=0)
    assert model.proj.packed.nbytes == 8 * 34 * 8  # 8 rows of 8 Q8_0 blocks


def test_lora_wraps_a_quantized_linear() -> None:
    model = Tiny()
    install_quantized(model, "proj.weight", _weight(), torch.float32)
    wrap_linears(model, "transformer", ["proj"])
    g = torch.Generator().manual_seed(1)
    layer = LoRALayer(down=torch.randn(2, 256, generator=g), up=torch.randn(8, 2, generator=g), scaling=0.5)
    x = torch.randn(2, 256)
    base = model.proj(x)
    with lora_scope(ActiveLoRAs({"transformer:proj": ((layer, 1.0),)})):
        adapted = model.proj(x)
    torch.testing.assert_close(adapted - base, 0.5 * (x @ layer.down.T @ layer.up.T), rtol=1e-5, atol=1e-5)


def test_compiles_without_graph_breaks() -> None:
    layer = GGUFLinear(_weight(qtype="Q6_K"), None, torch.float32)
    x = torch.randn(2, 256)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)


def test_fp8_and_fused_adapters_refuse_gguf_linears() -> None:
    from vidloom.core.errors import DeployError
    from vidloom.layers.fp8 import quantize_linears
    from vidloom.lora.fuse import _plain_linear

    model = Tiny()
    install_quantized(model, "proj.weight", _weight(), torch.float32)
    with pytest.raises(DeployError, match=r"fp8_weights \(--fp8\) cannot apply to weights loaded from a GGUF file "
                                          r"\(1 linears such as 'proj'"):
        quantize_linears(model)
    assert isinstance(model.head, nn.Linear)  # refused before anything was swapped
    with pytest.raises(DeployError, match=r"transformer\.proj is a GGUFLinear .*a GGUF file with fuse_loras"):
        _plain_linear({"transformer": model}, "transformer:proj")
