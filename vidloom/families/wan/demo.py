"""The built-in demo model: the real Wan2.1 architecture at a tiny size, random weights.

It is written once, as a diffusers-format checkpoint, into the user's cache dir and
then loaded through the same loader as real checkpoints, so the first command a new
user runs exercises the real path. Its weights are random: the video is noise-like.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.card import ModelCard, SamplingDefaults
from vidloom.models.wan.demo_parts import CROSS_ATTENTION_SCALE
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WAN_TRANSFORMER_NAME_MAP, WanTransformerConfig
from vidloom.models.wan.vae import WAN21_LATENTS_MEAN, WAN21_LATENTS_STD, WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig
from vidloom.demo.cache import DemoCheckpoint
from vidloom.demo.tokenizer import train_t5_tokenizer
from vidloom.demo.writer import Part, model_index, write_parts, write_pipeline_files, write_t5_encoder
from vidloom.families.wan.cards import wan_t2v_card

DEMO_ID = "wan2.1-demo"
DEMO_VERSION = 3  # bump when the demo's architecture or files change
DEMO_SEED = 20250225

DEMO_NOTE = (
    "wan2.1-demo has RANDOM weights (the real Wan2.1 architecture at a tiny size): its video is "
    "noise-like. For real videos pass a Wan2.1 Diffusers checkpoint directory with --model, "
    "e.g. one downloaded from Wan-AI/Wan2.1-T2V-1.3B-Diffusers."
)

DEMO_TRANSFORMER = {
    "_class_name": "WanTransformer3DModel",
    "patch_size": [1, 2, 2], "num_attention_heads": 4, "attention_head_dim": 16,
    "in_channels": 16, "out_channels": 16, "text_dim": 64, "freq_dim": 64, "ffn_dim": 128,
    "num_layers": 2, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6,
    "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024,
}
DEMO_VAE = {
    "_class_name": "AutoencoderKLWan",
    "base_dim": 16, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 1,
    "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0,
    # Wan2.1's real latent statistics, so the demo's normalisation has the real scale.
    "latents_mean": list(WAN21_LATENTS_MEAN), "latents_std": list(WAN21_LATENTS_STD),
}
DEMO_TEXT_ENCODER = {
    "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4,
    "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
    "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0,
}
# Wan2.1's scheduler config (Wan-AI/Wan2.1-T2V-1.3B-Diffusers, scheduler/scheduler_config.json).
WAN21_SCHEDULER = {
    "_class_name": "UniPCMultistepScheduler", "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 3.0,
    "solver_order": 2, "solver_type": "bh2", "predict_x0": True, "lower_order_final": True,
    "disable_corrector": [], "final_sigmas_type": "zero", "timestep_spacing": "linspace",
    "steps_offset": 0, "thresholding": False, "beta_schedule": "linear", "beta_start": 0.0001,
    "beta_end": 0.02, "use_karras_sigmas": False, "use_exponential_sigmas": False,
    "use_beta_sigmas": False, "rescale_betas_zero_snr": False, "solver_p": None,
    "sample_max_value": 1.0, "dynamic_thresholding_ratio": 0.995,
}
MODEL_INDEX = model_index(
    "WanPipeline",
    scheduler="diffusers:UniPCMultistepScheduler", text_encoder="transformers:UMT5EncoderModel",
    tokenizer="transformers:T5TokenizerFast", transformer="diffusers:WanTransformer3DModel",
    vae="diffusers:AutoencoderKLWan",
)
DEMO_DEFAULTS = SamplingDefaults(
    height=128, width=192, num_frames=17, fps=8, num_inference_steps=8,
    guidance_scale=5.0, flow_shift=3.0, sampler="unipc", negative_prompt="",
)

def demo_card() -> ModelCard:
    return wan_t2v_card(
        DEMO_ID, f"demo:{DEMO_ID}", DEMO_DEFAULTS,
        precision="float32", method="random-init",
        description="Wan2.1 T2V architecture at a tiny size with seeded random weights (runs on CPU in seconds)",
        notes=(DEMO_NOTE,),
    )


def write_demo_checkpoint(folder: Path) -> None:
    """Write the demo as a diffusers WanPipeline folder (loadable by diffusers too)."""
    torch.manual_seed(DEMO_SEED)
    write_parts(folder, demo_parts(DEMO_TRANSFORMER, DEMO_VAE, vae_fill=None))
    tokenizer = train_t5_tokenizer()
    write_text_encoder(folder / "text_encoder", vocab_size=len(tokenizer))
    write_pipeline_files(folder, WAN21_SCHEDULER, MODEL_INDEX, tokenizer)


def demo_parts(transformer: dict, vae: dict, vae_fill: float | None) -> tuple[Part, ...]:
    """A Wan demo's transformer and VAE, each writing its own config back."""
    return (
        Part("transformer", lambda: WanTransformer(WanTransformerConfig.from_diffusers(transformer)),
             WAN_TRANSFORMER_NAME_MAP, scale=CROSS_ATTENTION_SCALE),
        Part("vae", lambda: WanVAE(WanVAEConfig.from_diffusers(vae)), WAN_VAE_NAME_MAP, fill_std=vae_fill),
    )


def write_text_encoder(folder: Path, vocab_size: int) -> None:
    """The demo's UMT5 text encoder (random weights, built by transformers from a config)."""
    write_t5_encoder(folder, vocab_size, DEMO_TEXT_ENCODER, DEMO_SEED + 1)


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
