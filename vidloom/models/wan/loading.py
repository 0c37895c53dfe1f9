"""The Wan VAE and UMT5 text encoder of a diffusers folder, read the same way by every family that uses them."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.deploy import DeployConfig
from vidloom.loading.component_file import load_component
from vidloom.loading.diffusers_dir import DiffusersDir
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
    vae = WanVAE(vae_config)
    load_component(vae, ckpt.component_dir("vae"), WAN_VAE_NAME_MAP, vae_file, wan_vae_layouts(vae_config))
    text = encoder_or_elsewhere(lambda: WanTextEncoder.load(
        ckpt.component_dir("tokenizer"), ckpt.component_dir("text_encoder"), device, compute,
        offload=deploy.offload_text_encoder, cache_size=deploy.prompt_cache_size,
    ), deploy, text_encoder_here)
    return vae, text
