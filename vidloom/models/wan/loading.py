"""The Wan VAE and UMT5 text encoder of a diffusers folder, read the same way by every family that uses them."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.deploy import DeployConfig
from vidloom.loading.component_file import load_component
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.precision import materialize
from vidloom.models.wan.original_layout import wan_vae_layouts
from vidloom.models.wan.text import WanTextEncoder
from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig
from vidloom.text_encoders.elsewhere import EncoderElsewhere, encoder_or_elsewhere


def load_vae_and_text(
    ckpt: DiffusersDir, device: torch.device, compute: torch.dtype, deploy: DeployConfig, vae_file: Path | None = None,
    text_encoder_here: bool = True,
) -> tuple[WanVAE, WanTextEncoder | EncoderElsewhere]:
    """The Wan VAE (weights loaded, from `vae_file` when given, still on the CPU in float32) and the UMT5 text
    encoder on `device` (an EncoderElsewhere where `text_encoder_here` is False: parallel.text_encoder_rank)."""
    vae_config = ckpt.parse_component("vae", WanVAEConfig.from_diffusers)
    # Built on the meta device: the checkpoint fills every tensor (load_component refuses a missing one), so random
    # init and the channels-last copy of it were thrown away (0.19 of 0.21 CPU-s at the demo's size). Meta ops need
    # torch.fx's symbolic shapes (0.7 s with sympy), which transformers' UMT5 modules (imported above) already bring.
    vae = materialize(lambda: WanVAE(vae_config), torch.device("cpu"), torch.float32)
    load_component(vae, ckpt.component_dir("vae"), WAN_VAE_NAME_MAP, vae_file, wan_vae_layouts(vae_config))
    text = encoder_or_elsewhere(lambda: WanTextEncoder.load(
        ckpt.component_dir("tokenizer"), ckpt.component_dir("text_encoder"), device, compute,
        offload=deploy.offload_text_encoder, cache_size=deploy.prompt_cache_size,
    ), deploy, text_encoder_here)
    return vae, text
