"""wan2.2-demo: the Wan2.2 TI2V-5B architecture at a tiny size with seeded random weights.

What Wan2.2 adds to Wan2.1: the residual VAE with 2x2-patchified pixels (16x space, 4x time) and
per-token timesteps (`expand_timesteps`), which let one checkpoint run text to video and image to
video (the first latent frame is the image's). Written once into the user's cache as a WanPipeline
folder with our own modules, loaded through the same loader as real checkpoints. Its weights are random:
the video is noise by design.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.card import ModelCard, SamplingDefaults
from vidloom.core.request import Task
from vidloom.demo.cache import DemoCheckpoint, noise_note
from vidloom.demo.tokenizer import train_t5_tokenizer
from vidloom.demo.writer import latent_stats_config, model_index, write_parts, write_pipeline_files
from vidloom.families.wan.cards import wan_t2v_card
from vidloom.families.wan.demo import DEMO_TEXT_ENCODER, WAN21_SCHEDULER, demo_parts, write_text_encoder
from vidloom.families.wan.registered import WAN22_5B_GEOMETRY

DEMO_ID = "wan2.2-demo"
DEMO_VERSION = 3  # bump when the demo's architecture or files change
DEMO_SEED = 20250728
DEMO_NOTE = noise_note(DEMO_ID, "Wan2.2 TI2V-5B", "Wan-AI/Wan2.2-TI2V-5B-Diffusers")

Z_DIM = 8
DEMO_TRANSFORMER = {
    "_class_name": "WanTransformer3DModel",
    "patch_size": [1, 2, 2], "num_attention_heads": 2, "attention_head_dim": 16, "in_channels": Z_DIM,
    "out_channels": Z_DIM, "text_dim": DEMO_TEXT_ENCODER["d_model"], "freq_dim": 32, "ffn_dim": 64, "num_layers": 2,
    "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "image_dim": None,
    "added_kv_proj_dim": None, "rope_max_seq_len": 256,
}
# The TI2V-5B VAE layout (residual stages, 2x2 patching, a wider decoder) at a tiny width.
DEMO_VAE = {
    "_class_name": "AutoencoderKLWan",
    "base_dim": 8, "decoder_base_dim": 12, "z_dim": Z_DIM, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1,
    "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0, "is_residual": True,
    "patch_size": 2, "in_channels": 12, "out_channels": 12, "scale_factor_spatial": 16, "scale_factor_temporal": 4,
}
# Wan-AI/Wan2.2-TI2V-5B-Diffusers: one transformer, per-token timesteps, no CLIP image encoder.
MODEL_INDEX = model_index(
    "WanPipeline",
    scheduler="diffusers:UniPCMultistepScheduler", text_encoder="transformers:UMT5EncoderModel",
    tokenizer="transformers:T5TokenizerFast", transformer="diffusers:WanTransformer3DModel",
    transformer_2=[None, None], vae="diffusers:AutoencoderKLWan", boundary_ratio=None, expand_timesteps=True,
)
DEMO_DEFAULTS = SamplingDefaults(
    height=64, width=96, num_frames=9, fps=24, num_inference_steps=8,
    guidance_scale=5.0, flow_shift=5.0, sampler="unipc", negative_prompt="",
)


def demo_card() -> ModelCard:
    return wan_t2v_card(
        DEMO_ID, f"demo:{DEMO_ID}", DEMO_DEFAULTS, precision="float32", method="random-init",
        description="Wan2.2 TI2V-5B architecture (text/image to video, residual VAE) at a tiny size, random weights",
        notes=(DEMO_NOTE,), tasks=frozenset({Task.T2V, Task.I2V}), inputs=frozenset({"image"}), family="wan2.2",
        geometry=WAN22_5B_GEOMETRY,
    )


def write_demo_checkpoint(folder: Path) -> None:
    """A Wan2.2 TI2V WanPipeline folder from our own modules."""
    torch.manual_seed(DEMO_SEED)
    vae = {**DEMO_VAE, **latent_stats_config(DEMO_SEED + 1, Z_DIM)}
    write_parts(folder, demo_parts(DEMO_TRANSFORMER, vae, vae_fill=None))
    tokenizer = train_t5_tokenizer()
    write_text_encoder(folder / "text_encoder", vocab_size=len(tokenizer))
    write_pipeline_files(folder, {**WAN21_SCHEDULER, "flow_shift": 5.0}, MODEL_INDEX, tokenizer)


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
