"""Loading weights from diffusers folders: clear CheckpointErrors naming key and file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vidloom.core.errors import CheckpointError
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.name_map import NameMap
from vidloom.loading.safetensors_io import load_weights, save_weights, weight_files

MAP = NameMap((("layers.{n}.lin", "blocks.{n}.proj"),))


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.ModuleDict({"proj": torch.nn.Linear(3, 4)}) for _ in range(3)])
        self.head = torch.nn.Linear(4, 2)


def _saved(tmp_path: Path, **kw) -> tuple[Tiny, Path]:
    torch.manual_seed(0)
    module = Tiny()
    save_weights(module, tmp_path, MAP, **kw)
    return module, tmp_path


def test_round_trip_single_file(tmp_path):
    src, folder = _saved(tmp_path)
    assert (folder / "diffusion_pytorch_model.safetensors").is_file()
    assert "layers.0.lin.weight" in weight_files(folder)
    dst = Tiny()
    load_weights(dst, folder, MAP)
    for (name, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert torch.equal(a, b), name


def test_round_trip_sharded(tmp_path):
    src, folder = _saved(tmp_path, max_shard_bytes=64)
    index = json.loads((folder / "diffusion_pytorch_model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    dst = Tiny()
    load_weights(dst, folder, MAP)
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))


def _saved_then_edited(tmp_path: Path, edit) -> Path:
    """Save a Tiny checkpoint, then rewrite its file after `edit(state_dict)`."""
    from safetensors.torch import load_file

    _, folder = _saved(tmp_path)
    file = folder / "diffusion_pytorch_model.safetensors"
    state = load_file(str(file))
    edit(state)
    save_file(state, str(file))
    return folder


def test_missing_tensor_names_key(tmp_path):
    folder = _saved_then_edited(tmp_path, lambda state: state.pop("layers.2.lin.bias"))
    with pytest.raises(CheckpointError, match=r"missing tensors 'layers\.2\.lin\.bias'"):
        load_weights(Tiny(), folder, MAP)


def test_unexpected_tensor_names_key_and_file(tmp_path):
    folder = _saved_then_edited(tmp_path, lambda state: state.update({"extra.weight": torch.zeros(1)}))
    with pytest.raises(CheckpointError, match=r"diffusion_pytorch_model\.safetensors: unexpected tensor 'extra\.weight'"):
        load_weights(Tiny(), folder, MAP)


def test_wrong_shape_names_key_and_shapes(tmp_path):
    folder = _saved_then_edited(tmp_path, lambda state: state.update({"head.weight": torch.zeros(5, 4)}))
    with pytest.raises(CheckpointError, match=r"'head\.weight' has shape \(5, 4\).*expects \(2, 4\)"):
        load_weights(Tiny(), folder, MAP)


def test_missing_shard_is_named(tmp_path):
    _, folder = _saved(tmp_path, max_shard_bytes=64)
    shard = sorted(folder.glob("*-of-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=shard.name):
        load_weights(Tiny(), folder, MAP)


def test_no_weights_at_all(tmp_path):
    with pytest.raises(CheckpointError, match="no diffusion_pytorch_model.safetensors"):
        load_weights(Tiny(), tmp_path, MAP)


def test_directory_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        DiffusersDir.open(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="model_index.json is missing"):
        DiffusersDir.open(tmp_path)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "vae": ["diffusers", "X"]}))
    ckpt = DiffusersDir.open(tmp_path)
    with pytest.raises(CheckpointError, match="component folder 'vae' is missing"):
        ckpt.component_dir("vae")
    with pytest.raises(CheckpointError, match="lists no component 'transformer'"):
        ckpt.component_dir("transformer")
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="invalid JSON"):
        ckpt.component_config("vae")
