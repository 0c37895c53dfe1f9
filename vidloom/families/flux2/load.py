"""Load a Flux2 Klein card's checkpoint onto our modules: one resident copy per component."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError
from vidloom.core.instance import ModelInstance
from vidloom.layers.attention import resolve_attention
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.precision import default_compute_dtype, vae_dtype
from vidloom.loading.component_file import build_component, component_files, load_component
from vidloom.families.flux2.original_layout import FLUX2_TRANSFORMER_LAYOUTS
from vidloom.families.flux2.transformer import FLUX2_TRANSFORMER_NAME_MAP, Flux2Transformer, Flux2TransformerConfig
from vidloom.families.flux2.vae import FLUX2_VAE_NAME_MAP, Flux2VAE, Flux2VAEConfig
from vidloom.families.flux2.cards import check_pipeline, is_distilled
from vidloom.families.flux2.schedule import Flux2Schedule
from vidloom.families.flux2.text import Flux2TextEncoder
from vidloom.text_encoders.elsewhere import encoder_or_elsewhere


def load_instance(
    card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None, deploy: DeployConfig,
    text_encoder_here: bool = True,
) -> ModelInstance:
    """Read `checkpoint` (a diffusers Flux2KleinPipeline folder); CPU computes in `cpu_default_dtype()`
    (the VAE too: `vae_dtype`).

    `text_encoder_here`: False on a rank that receives encoded prompts from the rank holding the text encoder
    (parallel.text_encoder_rank): that rank's `text_encoder` is an EncoderElsewhere and its weights are never read.
    """
    ckpt = DiffusersDir.open_checked(checkpoint, check_pipeline, card.components)
    files = component_files(deploy.components, ("transformer", "vae"), str(ckpt.root))
    compute = default_compute_dtype(card.precision, device, dtype)
    dit_config = ckpt.parse_component("transformer", Flux2TransformerConfig.from_diffusers)
    vae_config = ckpt.parse_component("vae", Flux2VAEConfig.from_diffusers)
    schedule = ckpt.parse_component("scheduler", Flux2Schedule.from_diffusers, "scheduler_config.json")
    attention_fn = resolve_attention(deploy.attention_backend, device, compute)
    transformer = build_component(lambda: Flux2Transformer(dit_config, attention_fn), ckpt.component_dir("transformer"),
                                  FLUX2_TRANSFORMER_NAME_MAP, files.get("transformer"), FLUX2_TRANSFORMER_LAYOUTS,
                                  device, compute, Flux2Transformer.KEEP_FP32)
    vae = Flux2VAE(vae_config)
    load_component(vae, ckpt.component_dir("vae"), FLUX2_VAE_NAME_MAP, files.get("vae"))
    text = encoder_or_elsewhere(lambda: Flux2TextEncoder.load(
        ckpt.component_dir("tokenizer"), ckpt.component_dir("text_encoder"), device, compute,
        offload=deploy.offload_text_encoder, cache_size=deploy.prompt_cache_size,
    ), deploy, text_encoder_here)
    if isinstance(text, Flux2TextEncoder) and text.width != dit_config.text_dim:  # the rank holding it checks
        raise CheckpointError(
            f"{ckpt.root}: text encoder gives {text.width}-wide embeddings ({len(text.layers)} layers x hidden), "
            f"transformer joint_attention_dim is {dit_config.text_dim}"
        )
    components = {
        "transformer": transformer.eval(),
        "vae": vae.to(device=device, dtype=vae_dtype(card.components["vae"].dtype, device, compute)).eval(),
        "text_encoder": text,
        "schedule": schedule,
        "distilled": is_distilled(ckpt.root),
    }
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(ckpt.root), deploy=deploy)

