"""Load a Helios diffusers folder (HeliosPipeline, or HeliosPyramidPipeline: Mid or Distilled) onto our modules: one resident copy per component."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError
from vidloom.core.instance import ModelInstance
from vidloom.core.live_prompt import LIVE_PROMPTS, LivePrompts
from vidloom.families.helios.cards import check_pipeline, is_distilled, is_pyramid, zero_star
from vidloom.families.helios.dmd import dmd_schedule
from vidloom.families.helios.config import HELIOS_TRANSFORMER_NAME_MAP, HeliosTransformerConfig
from vidloom.families.helios.schedule import PYRAMID, HeliosSchedule, PyramidSettings
from vidloom.families.helios.transformer import HeliosTransformer
from vidloom.layers.attention import resolve_attention
from vidloom.layers.prompt_kv import padding_key_multiple
from vidloom.layers.fp8 import check_fp8_compute, quantize_linears
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.precision import default_compute_dtype, materialize
from vidloom.loading.precision import vae_dtype as vae_compute_dtype
from vidloom.loading.safetensors_io import load_weights
from vidloom.models.wan.loading import load_vae_and_text


def load_instance(card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None,
                  deploy: DeployConfig) -> ModelInstance:
    """Read `checkpoint` (a diffusers HeliosPipeline folder) and build the resident instance."""
    ckpt = DiffusersDir.open_checked(checkpoint, check_pipeline, card.components)
    compute = default_compute_dtype(card.precision, device, dtype)
    vae_dtype = vae_compute_dtype(card.components["vae"].dtype, device, compute)
    if deploy.fp8_weights:
        check_fp8_compute(device, compute)  # before any weight reaches the device

    config = ckpt.parse_component("transformer", HeliosTransformerConfig.from_diffusers)
    distilled = is_distilled(ckpt)
    parse = dmd_schedule if distilled else (lambda cfg: HeliosSchedule.from_diffusers(cfg, is_pyramid(ckpt)))
    schedule = ckpt.parse_component("scheduler", parse, "scheduler_config.json")
    z_dim = int(ckpt.component_config("vae").get("z_dim", 16))  # AutoencoderKLWan's default
    for key, value in (("in_channels", config.in_channels), ("out_channels", config.out_channels)):
        if value != z_dim:  # the loop feeds VAE latents and steps them by the prediction: one width
            raise CheckpointError(f"transformer config {key}={value}: must equal the VAE's z_dim={z_dim}")
    attention_fn = resolve_attention(deploy.attention_backend, device, compute)
    transformer = materialize(lambda: HeliosTransformer(config, attention_fn), device, compute,
                              HeliosTransformer.KEEP_FP32)
    load_weights(transformer, ckpt.component_dir("transformer"), HELIOS_TRANSFORMER_NAME_MAP)
    if deploy.fp8_weights:
        quantize_linears(transformer.blocks)
    transformer.prompt_key_multiple = padding_key_multiple(deploy)  # layers.prompt_kv
    vae, text = load_vae_and_text(ckpt, device, compute, deploy)
    components = {
        "transformer": transformer.eval(),
        "vae": vae.to(device=device, dtype=vae_dtype).eval(),
        "text_encoder": text,
        "schedule": schedule,
        PYRAMID: PyramidSettings(schedule.stages > 1, zero_star(ckpt), distilled),
        LIVE_PROMPTS: LivePrompts(),  # prompts set while a request runs, read at its chunk boundaries
    }
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(ckpt.root), deploy=deploy)
