"""load_vae_and_text builds the Wan VAE on the meta device and fills it from the checkpoint (issue #36, a fast start:
no random init the weights overwrite): the same tensors, in the same channels-last layout, as a VAE built eagerly and
then loaded, so its decode is bit-identical; a checkpoint missing a tensor is still refused before use."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError
from vidloom.loading.component_file import load_component
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.models.wan.loading import load_vae_and_text
from vidloom.models.wan.original_layout import wan_vae_layouts
from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig

CPU = torch.device("cpu")


def eager_vae(ckpt: DiffusersDir) -> WanVAE:
    """The VAE as it was built before: random init, then the checkpoint copied in."""
    config = ckpt.parse_component("vae", WanVAEConfig.from_diffusers)
    vae = WanVAE(config)
    load_component(vae, ckpt.component_dir("vae"), WAN_VAE_NAME_MAP, None, wan_vae_layouts(config))
    return vae


def test_the_vae_holds_the_checkpoint_in_the_eager_layout_without_drawing_random_numbers(wan_demo_checkpoint: Path):
    ckpt = DiffusersDir.open(wan_demo_checkpoint)
    reference = eager_vae(ckpt)
    rng = torch.get_rng_state()
    vae, _ = load_vae_and_text(ckpt, CPU, torch.float32, DeployConfig())
    assert torch.equal(torch.get_rng_state(), rng)  # no random init ran (the text encoder's load draws none either)
    loaded, expected = vae.state_dict(), reference.state_dict()
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert loaded[name].device == CPU and loaded[name].dtype == torch.float32, name
        assert loaded[name].stride() == tensor.stride(), name  # conv weights stay channels-last
        assert torch.equal(loaded[name], tensor), name
    latents = torch.randn(1, vae.config.z_dim, 2, 4, 6)
    assert torch.equal(vae.decode(latents), reference.decode(latents))


def test_a_vae_file_missing_a_tensor_is_refused(wan_demo_checkpoint: Path, tmp_path: Path):
    folder = tmp_path / "wan"
    shutil.copytree(wan_demo_checkpoint, folder)
    weights = folder / "vae" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    dropped = sorted(tensors)[0]
    del tensors[dropped]
    save_file(tensors, weights)
    with pytest.raises(CheckpointError, match="missing tensors"):
        load_vae_and_text(DiffusersDir.open(folder), CPU, torch.float32, DeployConfig())
