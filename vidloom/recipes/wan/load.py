"""Load a Wan2.1 card's checkpoint onto our modules: one resident copy per component."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError
from vidloom.core.instance import ModelInstance
from vidloom.diffusion.sampler import SamplerConfig
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.layers.attention import resolve_attention
from vidloom.layers.fp8 import check_fp8_compute, quantize_linears
from vidloom.loading.precision import materialize
from vidloom.loading.safetensors_io import load_weights
from vidloom.models.wan.transformer import WAN_TRANSFORMER_NAME_MAP, WanTransformer, WanTransformerConfig
from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig
from vidloom.recipes.wan.text import WanTextEncoder


def load_instance(
    card: ModelCard,
    checkpoint: Path,
    device: torch.device,
    dtype: torch.dtype | None,
    deploy: DeployConfig,
) -> ModelInstance:
    """Read `checkpoint` (a diffusers WanPipeline folder) and build the resident instance.

    `dtype` overrides the card's precision for the DiT and text encoder; by default
    CUDA runs the card's precision and CPU runs float32. The VAE keeps its card dtype.
    """
    ckpt = DiffusersDir.open(checkpoint)
    if ckpt.pipeline_class not in ("WanPipeline", ""):
        raise CheckpointError(f"{ckpt.root}: model_index.json says {ckpt.pipeline_class!r}, expected 'WanPipeline'")
    compute = dtype or (getattr(torch, card.precision) if device.type == "cuda" else torch.float32)
    vae_dtype = getattr(torch, card.components["vae"].dtype or "float32") if device.type == "cuda" else torch.float32
    if deploy.fp8_weights:
        check_fp8_compute(device, compute)  # before any weight reaches the device

    dit_config = WanTransformerConfig.from_diffusers(ckpt.component_config("transformer"))
    attention_fn = resolve_attention(deploy.attention_backend, device, compute)  # fails here, not mid-request
    transformer = materialize(lambda: WanTransformer(dit_config, attention_fn), device, compute, WanTransformer.KEEP_FP32)
    load_weights(transformer, ckpt.component_dir("transformer"), WAN_TRANSFORMER_NAME_MAP)
    _apply_deploy(transformer, deploy)
    vae = WanVAE(WanVAEConfig.from_diffusers(ckpt.component_config("vae")))
    load_weights(vae, ckpt.component_dir("vae"), WAN_VAE_NAME_MAP)
    text = WanTextEncoder.load(
        ckpt.component_dir("tokenizer"), ckpt.component_dir("text_encoder"), device, compute,
        offload=deploy.offload_text_encoder, cache_size=deploy.prompt_cache_size,
    )
    try:
        sampler_config = SamplerConfig.from_diffusers(ckpt.component_config("scheduler", "scheduler_config.json"))
    except ValueError as exc:
        raise CheckpointError(f"{ckpt.root}/scheduler/scheduler_config.json: {exc}") from None

    return ModelInstance(
        card=card,
        components={
            "transformer": transformer.eval(),
            "vae": vae.to(device=device, dtype=vae_dtype).eval(),
            "text_encoder": text,
            "sampler_config": sampler_config,
        },
        device=device,
        dtype=compute,
        checkpoint_dir=str(ckpt.root),
        deploy=deploy,
    )


def _apply_deploy(transformer: WanTransformer, deploy: DeployConfig) -> None:
    """Performance options applied from outside the model, in order: quantize, then compile."""
    if deploy.fp8_weights:
        # Block linears hold ~all DiT weights; embeddings and the head stay in full precision.
        quantize_linears(transformer.blocks)
    if deploy.compile:
        # Blocks are identical in structure, so one compiled graph serves all of them per shape.
        for block in transformer.blocks:
            block.compile(backend=deploy.compile_backend, dynamic=False)
