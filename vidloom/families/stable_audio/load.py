"""Load a Stable Audio card's checkpoint onto our modules (T5 through transformers): one resident copy each."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError
from vidloom.core.instance import ModelInstance
from vidloom.diffusion.cosine_dpm import CosineDPMConfig
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.name_map import NameMap
from vidloom.loading.precision import materialize
from vidloom.loading.safetensors_io import load_weights
from vidloom.families.stable_audio.projection import (
    STABLE_AUDIO_PROJECTION_NAME_MAP, ProjectionConfig, StableAudioProjection,
)
from vidloom.families.stable_audio.transformer import STABLE_AUDIO_DIT_NAME_MAP, StableAudioDiT, StableAudioDiTConfig
from vidloom.families.stable_audio.vae import OobleckDecoderConfig, OobleckVAE
from vidloom.families.stable_audio.cards import check_pipeline
from vidloom.families.stable_audio.text import StableAudioTextEncoder


def load_instance(
    card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None, deploy: DeployConfig
) -> ModelInstance:
    """Read `checkpoint` (a diffusers StableAudioPipeline folder); CPU computes in float32.

    Not on the bfloat16 CPU fast path: on stable-audio-demo (seed 3, 4 steps) a bfloat16 DiT and T5 put the
    waveform 13.6 dB SNR from float32's (13.4 with T5 in float32, 13.3 with the time embedding in float32 too),
    far under the 35 dB gate (docs/performance-cpu.md).
    """
    if importlib.util.find_spec("torchsde") is None:
        raise CheckpointError(f"{card.model_id}: its scheduler (CosineDPMSolverMultistepScheduler) draws "
                              "Brownian-tree noise with torchsde, which is not installed: pip install 'vidloom[audio]'")
    ckpt = DiffusersDir.open_checked(checkpoint, check_pipeline, card.components)
    compute = dtype or (getattr(torch, card.precision) if device.type == "cuda" else torch.float32)
    dit_config = ckpt.parse_component("transformer", StableAudioDiTConfig.from_diffusers)
    vae_config = ckpt.parse_component("vae", OobleckDecoderConfig.from_diffusers)
    projection_config = ckpt.parse_component("projection_model", ProjectionConfig.from_diffusers)
    sampler = ckpt.parse_component("scheduler", CosineDPMConfig.from_diffusers, "scheduler_config.json")
    if dit_config.in_channels != vae_config.latent_channels:
        raise CheckpointError(f"{ckpt.root}: transformer in_channels {dit_config.in_channels} != vae "
                              f"decoder_input_channels {vae_config.latent_channels}")
    if dit_config.cross_attention_input_dim != projection_config.conditioning_dim or \
            dit_config.global_states_input_dim != 2 * projection_config.conditioning_dim:
        raise CheckpointError(f"{ckpt.root}: the transformer's text and global widths must be the projection's "
                              f"conditioning_dim and twice it ({projection_config.conditioning_dim})")
    transformer = materialize(lambda: StableAudioDiT(dit_config), device, compute)
    load_weights(transformer, ckpt.component_dir("transformer"), STABLE_AUDIO_DIT_NAME_MAP)
    vae = OobleckVAE(vae_config)
    if vae_config.encoder_channels != 2 * vae_config.latent_channels:
        raise CheckpointError(f"{ckpt.root}/vae/config.json: encoder_hidden_size {vae_config.encoder_channels} must be "
                              f"twice decoder_input_channels {vae_config.latent_channels} (the posterior's mean and scale)")
    load_weights(vae, ckpt.component_dir("vae"), NameMap(()))
    projection = StableAudioProjection(projection_config)
    load_weights(projection, ckpt.component_dir("projection_model"), STABLE_AUDIO_PROJECTION_NAME_MAP)
    projection = projection.to(device).eval()
    text = StableAudioTextEncoder.load(ckpt.component_dir("tokenizer"), ckpt.component_dir("text_encoder"),
                                       projection, device, compute, cache_size=deploy.prompt_cache_size)
    components = {
        "transformer": transformer.eval(),
        "vae": vae.to(device=device, dtype=torch.float32).eval(),
        "text_encoder": text,
        "projection_model": projection,
        "scheduler": sampler,
    }
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(ckpt.root), deploy=deploy)
