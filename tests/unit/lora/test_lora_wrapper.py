"""LoRALinear and the per-step scope: the PEFT formula, mixing, nothing outside a scope, files read as written."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from vidloom.core.errors import CheckpointError
from vidloom.lora.apply import ActiveLoRAs, LoRALinear, lora_rows_scope, lora_scope, wrap_linears
from vidloom.lora.files import METADATA_KEY, LoRALayer, read_lora_file


def _layer(rank: int, d_in: int, d_out: int, scaling: float, seed: int) -> LoRALayer:
    g = torch.Generator().manual_seed(seed)
    return LoRALayer(torch.randn(rank, d_in, generator=g), torch.randn(d_out, rank, generator=g), scaling)


def test_wrapper_adds_each_scaled_low_rank_update_only_inside_a_scope():
    base = nn.Linear(6, 5)
    model = nn.Sequential(base)
    assert wrap_linears(model, "transformer", ["0"]) == 1
    assert wrap_linears(model, "transformer", ["0"]) == 0  # already wrapped: left as is
    wrapped = model[0]
    assert isinstance(wrapped, LoRALinear) and wrapped.base is base
    a, b = _layer(2, 6, 5, 2.0, 0), _layer(3, 6, 5, 0.5, 1)
    x = torch.randn(4, 6)
    active = ActiveLoRAs({"transformer:0": ((a, 0.8), (b, -1.5))})
    with lora_scope(active):
        got = model(x)
    expected = base(x) + 0.8 * 2.0 * (x @ a.down.T @ a.up.T) - 1.5 * 0.5 * (x @ b.down.T @ b.up.T)
    torch.testing.assert_close(got, expected)
    assert torch.equal(model(x), base(x)), "outside a scope the wrapper must be the base linear"
    with lora_scope(ActiveLoRAs({"transformer:other": ((a, 1.0),)})):
        assert torch.equal(model(x), base(x)), "an adapter for another layer must not touch this one"


def test_scope_is_private_to_its_thread():
    model = nn.Sequential(nn.Linear(3, 3))
    wrap_linears(model, "t", ["0"])
    x = torch.randn(2, 3)
    seen = []
    inside, done = threading.Event(), threading.Event()

    def other_thread() -> None:
        inside.wait()
        seen.append(model(x))
        done.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with lora_scope(ActiveLoRAs({"t:0": ((_layer(1, 3, 3, 1.0, 2), 1.0),)})):
        inside.set()
        done.wait()
    worker.join()
    assert torch.equal(seen[0], model[0].base(x))


def _save(path, tensors, config=None):
    metadata = {METADATA_KEY: json.dumps({f"transformer.{k}": v for k, v in config.items()})} if config else None
    save_file(tensors, str(path), metadata=metadata)
    return path


def test_scaling_follows_peft_alpha_rank_patterns_and_alpha_keys(tmp_path):
    pair = {"transformer.x.q.lora_A.weight": torch.zeros(4, 6), "transformer.x.q.lora_B.weight": torch.zeros(5, 4),
            "transformer.y.q.lora_A.weight": torch.zeros(4, 6), "transformer.y.q.lora_B.weight": torch.zeros(5, 4)}
    config = {"r": 4, "lora_alpha": 8, "alpha_pattern": {"y.q": 2}}
    layers = read_lora_file(_save(tmp_path / "a.safetensors", pair, config), "transformer").layers
    assert layers["x.q"].scaling == 2.0 and layers["y.q"].scaling == 0.5
    rs = read_lora_file(_save(tmp_path / "b.safetensors", pair, {"r": 4, "lora_alpha": 8, "use_rslora": True}),
                        "transformer").layers
    assert rs["x.q"].scaling == 4.0  # alpha / sqrt(r)
    bare = read_lora_file(_save(tmp_path / "c.safetensors", pair), "transformer").layers
    assert bare["x.q"].scaling == 1.0  # no metadata: diffusers takes alpha = r
    alpha = read_lora_file(_save(tmp_path / "d.safetensors", {**pair, "transformer.x.q.alpha": torch.tensor(2.0)}),
                           "transformer").layers
    assert alpha["x.q"].scaling == 0.5 and alpha["y.q"].scaling == 1.0


@pytest.mark.parametrize("tensors, config, message", [
    ({"unet.x.lora_A.weight": torch.zeros(2, 3)}, None, "'unet.x.lora_A.weight' is not a diffusers/PEFT LoRA key"),
    ({"transformer.x.lora_down.weight": torch.zeros(2, 3)}, None, "not a diffusers/PEFT LoRA key"),
    ({"transformer.x.lora_A.weight": torch.zeros(2, 3)}, None, "'x' has no '.lora_B.weight'"),
    ({"transformer.x.lora_A.weight": torch.zeros(2, 3), "transformer.x.lora_B.weight": torch.zeros(4, 3)}, None,
     "not a rank-r pair"),
    ({"transformer.x.lora_A.weight": torch.zeros(2, 3), "transformer.x.lora_B.weight": torch.zeros(4, 2)},
     {"r": 8}, "has rank 2, the file's metadata declares r=8"),
    ({"transformer.x.lora_A.weight": torch.zeros(2, 3), "transformer.x.lora_B.weight": torch.zeros(4, 2)},
     {"r": 2, "use_dora": True}, "DoRA"),
])
def test_bad_files_name_the_file_and_key(tmp_path, tensors, config, message):
    path = _save(tmp_path / "bad.safetensors", tensors, config)
    with pytest.raises(CheckpointError, match="bad.safetensors") as err:
        read_lora_file(path, "transformer")
    assert message in str(err.value)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(CheckpointError, match="no such LoRA file"):
        read_lora_file(tmp_path / "nope.safetensors", "transformer")
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="corrupt.safetensors: not a readable safetensors"):
        read_lora_file(corrupt, "transformer")


def test_rows_scope_applies_each_runs_adapters_to_its_own_rows_in_every_cfg_repeat():
    model = nn.Sequential(nn.Linear(6, 5))
    wrap_linears(model, "transformer", ["0"])
    a, b = _layer(2, 6, 5, 2.0, 0), _layer(3, 6, 5, 0.5, 1)
    first, second = ActiveLoRAs({"transformer:0": ((a, 0.8),)}), ActiveLoRAs({"transformer:0": ((b, -1.0),)})
    runs = [(first, 2), (None, 1), (second, 3)]  # 6 stacked rows: run 1 has no adapters
    x = torch.randn(12, 6)  # two CFG passes stacked: [cond of all runs; uncond of all runs]
    with lora_rows_scope(runs):
        got = model(x)
    expected = []
    for half in (x[:6], x[6:]):
        start = 0
        for active, rows in runs:
            with lora_scope(active):
                expected.append(model(half[start:start + rows]))
            start += rows
    torch.testing.assert_close(got, torch.cat(expected))
    with lora_rows_scope(runs), pytest.raises(RuntimeError, match="not a repeat of the 6 stacked rows"):
        model(torch.randn(7, 6))
    with lora_rows_scope([(None, 2), (None, 3)]):
        assert torch.equal(model(x[:5]), model[0].base(x[:5]))
