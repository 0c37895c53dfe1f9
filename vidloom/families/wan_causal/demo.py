"""far-demo: the AnyFlow-FAR causal architecture at a tiny size with seeded random weights.

Written once into the user's cache as an AnyFlowFARPipeline folder and loaded through the same loader as
real FAR checkpoints, so chunked causal rollout (KV cache, far-context compression) and extension run
offline in seconds. Its weights are random: the video is noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig
from vidloom.models.wan.demo_parts import CROSS_ATTENTION_SCALE, TINY_UMT5, TINY_WAN_VAE
from vidloom.families.wan_causal.config import FAR_TRANSFORMER_NAME_MAP, FarTransformerConfig
from vidloom.families.wan_causal.transformer import FarTransformer
from vidloom.demo.cache import DemoCheckpoint, noise_note
from vidloom.demo.tokenizer import train_t5_tokenizer
from vidloom.demo.writer import (
    Part, latent_stats_config, model_index, write_parts, write_pipeline_files, write_t5_encoder,
)
from vidloom.families.wan_causal.cards import DEFAULTS, far_card

DEMO_ID = "far-demo"
DEMO_VERSION = 3  # bump when the demo's architecture or files change
DEMO_SEED = 20250225  # wan2.1-demo's, which far-demo's files were first written with
DEMO_NOTE = noise_note(DEMO_ID, "AnyFlow-FAR", "nvidia/AnyFlow-FAR-Wan2.1-1.3B-Diffusers")

# Full-resolution patches 2x2, far-context patches 4x4, two chunks kept at full resolution: a 17-frame
# video (5 latent frames) is three chunks, and extending it pushes the oldest into compressed context.
DEMO_TRANSFORMER = {
    "_class_name": "AnyFlowFARTransformer3DModel",
    "patch_size": [1, 2, 2], "compressed_patch_size": [1, 4, 4], "full_chunk_limit": 2,
    "num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 4, "out_channels": 4, "text_dim": 32,
    "freq_dim": 32, "ffn_dim": 64, "num_layers": 2, "cross_attn_norm": True, "eps": 1e-6,
    "rope_max_seq_len": 256, "gate_value": 0.25, "deltatime_type": "r", "chunk_partition": [1, 2, 2],
}
# Wan's sharper cross-attention, and its output x3: the few-step causal rollout gives the text fewer steps
# to act (with the logits alone a new prompt moved the video by 1.5 levels on average).
FAR_CROSS_ATTENTION_SCALE = (*CROSS_ATTENTION_SCALE, ("blocks.*.cross_attn.out.weight", 3.0))
DEMO_VAE, DEMO_TEXT_ENCODER = TINY_WAN_VAE, TINY_UMT5
# FlowMapEulerDiscreteScheduler as the AnyFlow-FAR release saves it (shift 5).
DEMO_SCHEDULER = {"_class_name": "FlowMapEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 5.0}
MODEL_INDEX = model_index(
    "AnyFlowFARPipeline",
    scheduler="diffusers:FlowMapEulerDiscreteScheduler", text_encoder="transformers:UMT5EncoderModel",
    tokenizer="transformers:T5TokenizerFast", transformer="diffusers:AnyFlowFARTransformer3DModel",
    vae="diffusers:AutoencoderKLWan",
)
DEMO_DEFAULTS = dataclasses.replace(DEFAULTS, height=64, width=96, num_frames=17, fps=8)


def demo_card() -> ModelCard:
    card = far_card(DEMO_ID, f"demo:{DEMO_ID}", DEMO_DEFAULTS,
                    "AnyFlow-FAR causal streaming video (chunked rollout, extension) at a tiny size, random weights")
    return dataclasses.replace(card, precision="float32", notes=(DEMO_NOTE,))


def write_demo_checkpoint(folder: Path) -> None:
    """An AnyFlowFARPipeline folder from our own modules (diffusers can load it too)."""
    torch.manual_seed(DEMO_SEED)
    # Non-trivial latent statistics, so the demo's (de)normalisation is exercised as a real one is.
    vae = {**DEMO_VAE, **latent_stats_config(DEMO_SEED + 1, DEMO_VAE["z_dim"])}
    write_parts(folder, (
        Part("transformer", lambda: FarTransformer(FarTransformerConfig.from_diffusers(DEMO_TRANSFORMER)),
             FAR_TRANSFORMER_NAME_MAP, DEMO_TRANSFORMER, scale=FAR_CROSS_ATTENTION_SCALE),
        Part("vae", lambda: WanVAE(WanVAEConfig.from_diffusers(vae)), WAN_VAE_NAME_MAP, fill_std=None),
    ))
    tokenizer = train_t5_tokenizer()
    write_t5_encoder(folder / "text_encoder", len(tokenizer), DEMO_TEXT_ENCODER, DEMO_SEED + 2)
    write_pipeline_files(folder, DEMO_SCHEDULER, MODEL_INDEX, tokenizer)


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
