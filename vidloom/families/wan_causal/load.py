"""Load an AnyFlow-FAR diffusers folder onto our modules: one resident copy per component."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError
from vidloom.core.instance import ModelInstance
from vidloom.layers.attention import resolve_attention
from vidloom.layers.fp8 import check_fp8_compute, quantize_linears
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.precision import default_compute_dtype, materialize
from vidloom.loading.precision import vae_dtype as vae_compute_dtype
from vidloom.loading.safetensors_io import load_weights
from vidloom.families.wan_causal.config import FAR_TRANSFORMER_NAME_MAP, FarTransformerConfig
from vidloom.families.wan_causal.transformer import FarTransformer
from vidloom.diffusion.sampler import load_sampler_config
from vidloom.models.wan.loading import load_vae_and_text
from vidloom.families.wan_causal.cards import PIPELINE_CLASS

# AnyFlowFARPipeline.__init__'s components (diffusers 0.42): the only keys its model_index.json may hold.
FAR_INDEX_COMPONENTS = ("tokenizer", "text_encoder", "transformer", "vae", "scheduler")


def check_pipeline(ckpt: DiffusersDir) -> None:
    ckpt.expect_pipeline(PIPELINE_CLASS)
    ckpt.check_index(FAR_INDEX_COMPONENTS)  # AnyFlowFARPipeline has no pipeline-level settings


def load_instance(
    card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None, deploy: DeployConfig,
    text_encoder_here: bool = True,
) -> ModelInstance:
    """Read `checkpoint` (a diffusers AnyFlowFARPipeline folder) and build the resident instance; without
    `text_encoder_here` (another rank holds it: parallel.text_encoder_rank) the text encoder's weights are not read."""
    ckpt = DiffusersDir.open_checked(checkpoint, check_pipeline, card.components)
    compute = default_compute_dtype(card.precision, device, dtype)
    vae_dtype = vae_compute_dtype(card.components["vae"].dtype, device, compute)
    if deploy.fp8_weights:
        check_fp8_compute(device, compute)  # before any weight reaches the device, as for Wan

    config = ckpt.parse_component("transformer", FarTransformerConfig.from_diffusers)
    # Before any weight is read. AutoencoderKLWan's default z_dim is 16.
    _check_channels(config, int(ckpt.component_config("vae").get("z_dim", 16)))
    attention_fn = resolve_attention(deploy.attention_backend, device, compute)
    transformer = materialize(lambda: FarTransformer(config, attention_fn), device, compute, FarTransformer.KEEP_FP32)
    load_weights(transformer, ckpt.component_dir("transformer"), FAR_TRANSFORMER_NAME_MAP)
    if deploy.fp8_weights:
        quantize_linears(transformer.blocks)
    vae, text = load_vae_and_text(ckpt, device, compute, deploy, text_encoder_here=text_encoder_here)
    sampler_config = load_sampler_config(ckpt)
    components = {
        "transformer": transformer.eval(),
        "vae": vae.to(device=device, dtype=vae_dtype).eval(),
        "text_encoder": text,
        "sampler_config": sampler_config,
    }
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(ckpt.root), deploy=deploy)


def _check_channels(config: FarTransformerConfig, z_dim: int) -> None:
    """The rollout feeds the transformer VAE latents and adds its prediction to them: all one width."""
    wan = config.wan
    for key, value in (("in_channels", wan.in_channels), ("out_channels", wan.out_channels)):
        if value != z_dim:
            raise CheckpointError(f"transformer config {key}={value}: must equal the VAE's z_dim={z_dim}")
