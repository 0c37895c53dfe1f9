"""Loading real diffusers-written Wan folders: sharded weights, and clear errors when broken."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from vidloom.core.errors import CheckpointError
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from tests.helpers.config_keys import copy_with_keys, merge_keys

SMALL = dict(prompt="a train crosses a bridge", height=32, width=32, num_frames=5, num_inference_steps=2, seed=5)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_sharded_transformer_loads_identically(tiny_wan_dir, tmp_path):
    from diffusers import WanTransformer3DModel

    folder = _copy(tiny_wan_dir, tmp_path / "sharded")
    ref = WanTransformer3DModel.from_pretrained(str(tiny_wan_dir / "transformer"))
    shutil.rmtree(folder / "transformer")
    ref.save_pretrained(str(folder / "transformer"), max_shard_size="20KB")
    assert (folder / "transformer" / "diffusion_pytorch_model.safetensors.index.json").is_file()

    plain = VideoGenerator.from_pretrained(tiny_wan_dir, device="cpu").engine.run(GenerationRequest(**SMALL))
    sharded = VideoGenerator.from_pretrained(folder, device="cpu").engine.run(GenerationRequest(**SMALL))
    assert np.array_equal(plain["video"], sharded["video"])


def test_missing_component_folder_is_named(tiny_wan_dir, tmp_path):
    folder = _copy(tiny_wan_dir, tmp_path / "novae")
    shutil.rmtree(folder / "vae")
    with pytest.raises(CheckpointError, match="component folder 'vae' is missing"):
        VideoGenerator.from_pretrained(folder, device="cpu")


def test_missing_tensor_is_named(tiny_wan_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(tiny_wan_dir, tmp_path / "holes")
    file = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(file))
    del state["blocks.1.attn2.to_k.weight"]
    save_file(state, str(file))
    with pytest.raises(CheckpointError, match=r"'blocks\.1\.attn2\.to_k\.weight'"):
        VideoGenerator.from_pretrained(folder, device="cpu")


def test_mis_shaped_config_is_caught(tiny_wan_dir, tmp_path):
    folder = _copy(tiny_wan_dir, tmp_path / "badcfg")
    config_file = folder / "transformer" / "config.json"
    merge_keys(config_file, ffn_dim=json.loads(config_file.read_text())["ffn_dim"] * 2)
    with pytest.raises(CheckpointError, match=r"ffn.*has shape"):
        VideoGenerator.from_pretrained(folder, device="cpu")


def test_unsupported_scheduler_is_named(tiny_wan_dir, tmp_path):
    folder = copy_with_keys(tiny_wan_dir, tmp_path / "badsched", "scheduler/scheduler_config.json",
                            prediction_type="epsilon")
    with pytest.raises(CheckpointError, match=r"scheduler_config\.json: UniPCMultistepScheduler: prediction_type='epsilon' is not supported"):
        VideoGenerator.from_pretrained(folder, device="cpu")


def test_bf16_dtype_keeps_fp32_islands(tiny_wan_dir):
    gen = VideoGenerator.from_pretrained(tiny_wan_dir, device="cpu", dtype="bfloat16")
    transformer = gen.engine.instance["transformer"]
    dtypes = {name: p.dtype for name, p in transformer.named_parameters()}
    assert dtypes["blocks.0.self_attn.q.weight"] == torch.bfloat16
    assert dtypes["blocks.0.modulation"] == torch.float32
    out = gen.engine.run(GenerationRequest(**SMALL))["video"]
    assert np.isfinite(out).all()
