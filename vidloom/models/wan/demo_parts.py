"""What the Wan-architecture demos (wan2.1, wan2.2, AnyFlow-FAR) share in how their random weights are written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vidloom.demo.tokenizer import train_t5_tokenizer
from vidloom.demo.writer import Part, latent_stats_config, write_parts, write_pipeline_files, write_t5_encoder
from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig

# Cross-attention logits x4 (q and k norms x2): the prompt's ~10 tokens then outweigh Wan's ~500 identical
# zero-padding tokens, which at default init take ~97% of the attention, so the text reaches the video.
CROSS_ATTENTION_SCALE = (("blocks.*.cross_attn.norm_[qk].weight", 2.0),)

# The tiny Wan2.1 VAE and UMT5 encoder the Wan-architecture demos ship beside their transformer.
TINY_WAN_VAE = {
    "_class_name": "AutoencoderKLWan",
    "base_dim": 8, "z_dim": 4, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1, "attn_scales": [],
    "temperal_downsample": [False, True, True], "dropout": 0.0,
}
TINY_UMT5 = {
    "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
    "relative_attention_num_buckets": 8, "relative_attention_max_distance": 32,
    "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0,
}


def write_wan_demo_folder(folder: Path, transformer: Part, seed: int, scheduler: dict[str, Any],
                          index: dict[str, Any]) -> None:
    """A diffusers folder of `transformer` beside the tiny Wan VAE (seeded non-trivial latent statistics, so the
    (de)normalisation is exercised as a real one is), a UMT5 encoder with the offline tokenizer, the scheduler
    config and model_index.json."""
    torch.manual_seed(seed)
    vae = {**TINY_WAN_VAE, **latent_stats_config(seed + 1, TINY_WAN_VAE["z_dim"])}
    write_parts(folder, (
        transformer,
        Part("vae", lambda: WanVAE(WanVAEConfig.from_diffusers(vae)), WAN_VAE_NAME_MAP, fill_std=None),
    ))
    tokenizer = train_t5_tokenizer()
    write_t5_encoder(folder / "text_encoder", len(tokenizer), TINY_UMT5, seed + 2)
    write_pipeline_files(folder, scheduler, index, tokenizer)
