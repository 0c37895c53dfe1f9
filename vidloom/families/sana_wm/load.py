"""Load a SANA-WM card's checkpoint onto our modules: one resident copy per component."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError
from vidloom.core.instance import ModelInstance
from vidloom.diffusion.flow_euler import FlowEulerSampler
from vidloom.diffusion.sampler import SamplerConfig
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.precision import default_compute_dtype
from vidloom.models.ltx2.checkpoint import load_video_vae
from vidloom.families.sana_wm.checkpoint import load_transformer
from vidloom.families.sana_wm.cards import check_pipeline
from vidloom.families.sana_wm.refiner_load import REFINER_FOLDER, load_refiner
from vidloom.families.sana_wm.text import MAX_TEXT_TOKENS, SanaWMTextEncoder
from vidloom.text_encoders.elsewhere import encoder_or_elsewhere


def load_instance(card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None,
                  deploy: DeployConfig, text_encoder_here: bool = True) -> ModelInstance:
    """Read `checkpoint` (a diffusers SanaWMPipeline folder); CPU computes in `cpu_default_dtype()` (VAE in float32).

    `text_encoder_here`: False on a rank that receives encoded prompts from the rank holding the text encoders
    (parallel.text_encoder_rank): that rank's `text_encoder` (Gemma-2) and, under --two-stage, `refiner_text`
    (the refiner's Gemma-3 and connectors) are EncoderElsewhere markers; their weights are never read."""
    ckpt = DiffusersDir.open_checked(checkpoint, check_pipeline, card.components)
    compute = default_compute_dtype(card.precision, device, dtype)
    scheduler = ckpt.parse_component("scheduler", SamplerConfig.from_diffusers, "scheduler_config.json")
    transformer = load_transformer(ckpt.component_dir("transformer"), device, compute)
    text = encoder_or_elsewhere(lambda: SanaWMTextEncoder.load(
        ckpt.component_dir("tokenizer"), ckpt.component_dir("text_encoder"), device, compute,
        card.max_prompt_tokens or MAX_TEXT_TOKENS, offload=deploy.offload_text_encoder,
        cache_size=deploy.prompt_cache_size,
    ), deploy, text_encoder_here)
    if isinstance(text, SanaWMTextEncoder) and text.hidden_size != transformer.config.caption_channels:
        raise CheckpointError(f"{ckpt.root}: the text encoder's width {text.hidden_size} != the transformer's "
                              f"caption_channels {transformer.config.caption_channels}")
    vae = load_video_vae(ckpt.component_dir("vae"), device)
    if vae.config.timestep_conditioning:
        raise CheckpointError(f"{ckpt.root}/vae: timestep_conditioning is set, but SanaWMPipeline decodes "
                              "without a decode timestep")
    if vae.config.latent_channels != transformer.config.in_channels:
        raise CheckpointError(f"{ckpt.root}: the VAE's {vae.config.latent_channels} latent channels != the "
                              f"transformer's in_channels {transformer.config.in_channels}")
    components = {"transformer": transformer, "text_encoder": text, "vae": vae,
                  "sampler": FlowEulerSampler(scheduler)}
    if deploy.upsampler is not None:
        raise DeployError("upsampler (--upsampler) is LTX-2's latent upsampler; SANA-WM's stage 2 is the "
                          f"refiner in {ckpt.root}/{REFINER_FOLDER}/ (--two-stage)")
    if deploy.two_stage:
        components.update(load_refiner(ckpt.root, device, compute, vae.config.latent_channels, deploy,
                                       text_encoder_here))
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(ckpt.root), deploy=deploy)
