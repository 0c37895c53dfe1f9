"""Load a Qwen-Image card's checkpoint: our transformer and (Wan's) VAE, transformers' Qwen2.5-VL text encoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError
from vidloom.core.instance import ModelInstance
from vidloom.layers.attention import resolve_attention
from vidloom.loading.component_file import build_component, component_files, load_component
from vidloom.loading.config_keys import check_class_name
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.key_policy import KeyPolicy
from vidloom.loading.precision import default_compute_dtype, materialize, vae_dtype
from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig
from vidloom.families.qwen_image.cards import check_pipeline
from vidloom.families.qwen_image.schedule import QwenImageSchedule
from vidloom.families.qwen_image.text import QwenImageTextEncoder
from vidloom.text_encoders.elsewhere import encoder_or_elsewhere
from vidloom.families.qwen_image.transformer import (
    QWEN_IMAGE_TRANSFORMER_NAME_MAP, QwenImageTransformer, QwenImageTransformerConfig,
)

# AutoencoderKLQwenImage is AutoencoderKLWan's 2.1 architecture under other config names (same state-dict keys,
# same outputs: checked against diffusers in tests/parity/test_qwen_image_generation.py), so Wan's VAE runs it.
VAE_CLASS_NAME = "AutoencoderKLQwenImage"
VAE_KEYS = KeyPolicy(frozenset({"base_dim", "z_dim", "dim_mult", "num_res_blocks", "attn_scales",
                                "temperal_downsample", "dropout", "input_channels", "latents_mean", "latents_std"}))


def vae_config(cfg: Mapping[str, Any]) -> WanVAEConfig:
    """An AutoencoderKLQwenImage config.json as the Wan VAE config it describes."""
    check_class_name(cfg, (VAE_CLASS_NAME,), "VAE config")
    VAE_KEYS.check(cfg, "VAE config")
    if int(cfg.get("input_channels", 3)) != 3:
        raise CheckpointError(f"VAE config: input_channels {cfg['input_channels']} (Qwen-Image-Layered's RGBA VAE) "
                              "is not supported; expected 3")
    wan = {k: v for k, v in cfg.items() if k in VAE_KEYS.read and k != "input_channels"}
    return WanVAEConfig.from_diffusers({"_class_name": "AutoencoderKLWan", **wan})


def load_instance(card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None,
                  deploy: DeployConfig, text_encoder_here: bool = True) -> ModelInstance:
    """Read `checkpoint` (a diffusers QwenImagePipeline folder); CPU computes in `cpu_default_dtype()`.

    `text_encoder_here`: False on a rank that receives encoded prompts from the rank holding the text encoder
    (parallel.text_encoder_rank): that rank's `text_encoder` is an EncoderElsewhere and its weights are never read.
    """
    ckpt = DiffusersDir.open_checked(checkpoint, check_pipeline, card.components)
    files = component_files(deploy.components, ("transformer",), str(ckpt.root))
    compute = default_compute_dtype(card.precision, device, dtype)
    dit_config = ckpt.parse_component("transformer", QwenImageTransformerConfig.from_diffusers)
    schedule = ckpt.parse_component("scheduler", QwenImageSchedule.from_diffusers, "scheduler_config.json")
    vae_shape = ckpt.parse_component("vae", vae_config)
    vae = materialize(lambda: WanVAE(vae_shape), torch.device("cpu"), torch.float32)  # the checkpoint fills it all
    load_component(vae, ckpt.component_dir("vae"), WAN_VAE_NAME_MAP)
    # Batched CFG pads the shorter prompt and masks its padding: a kernel without masks is refused, and so is
    # sequence parallel (its shards carry their own padding mask).
    batched_cfg = deploy.cfg_mode == "batched"
    if batched_cfg and deploy.parallel.sp > 1:
        raise DeployError("cfg_mode='batched' masks a padded prompt, which sequence parallel (--sp) cannot carry; "
                          "leave cfg_mode at 'sequential' with --sp")
    attention_fn = resolve_attention(deploy.attention_backend, device, compute, masked=batched_cfg)
    transformer = build_component(lambda: QwenImageTransformer(dit_config, attention_fn),
                                  ckpt.component_dir("transformer"), QWEN_IMAGE_TRANSFORMER_NAME_MAP,
                                  files.get("transformer"), (), device, compute, QwenImageTransformer.KEEP_FP32)
    processor = ckpt.component_dir("processor") if "processor" in card.components else None
    text = encoder_or_elsewhere(lambda: QwenImageTextEncoder.load(
        ckpt.component_dir("tokenizer"), ckpt.component_dir("text_encoder"), device, compute, processor,
        offload=deploy.offload_text_encoder, cache_size=deploy.prompt_cache_size), deploy, text_encoder_here)
    if isinstance(text, QwenImageTextEncoder) and text.width != dit_config.text_dim:  # the rank holding it checks
        raise CheckpointError(f"{ckpt.root}: text encoder hidden size {text.width}, transformer joint_attention_dim "
                              f"is {dit_config.text_dim}")
    if vae.config.z_dim != dit_config.latent_channels:
        raise CheckpointError(f"{ckpt.root}: VAE z_dim {vae.config.z_dim}, transformer reads "
                              f"{dit_config.latent_channels} latent channels (in_channels / patch_size^2)")
    components = {
        "transformer": transformer.eval(),
        "vae": vae.to(device=device, dtype=vae_dtype(card.components["vae"].dtype, device, compute)).eval(),
        "text_encoder": text,
        "schedule": schedule,
    }
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(ckpt.root), deploy=deploy)
