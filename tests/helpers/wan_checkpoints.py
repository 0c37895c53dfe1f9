"""Tiny Wan2.1 checkpoints written by diffusers + transformers (random weights, offline tokenizer).

These are the reference side of parity tests: the folders are produced by the
reference libraries themselves, so loading them also tests our checkpoint reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from vidloom.demo.tokenizer import train_t5_tokenizer
from vidloom.families.wan.demo import WAN21_SCHEDULER


@dataclass(frozen=True)
class TinyWan:
    """One tiny configuration of the real architecture."""

    name: str
    transformer: dict
    vae: dict
    text_encoder: dict = field(default_factory=lambda: {
        "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
        "relative_attention_num_buckets": 8, "relative_attention_max_distance": 32,
        "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0,
    })


def _latent_stats(z_dim: int, seed: int) -> tuple[list[float], list[float]]:
    g = torch.Generator().manual_seed(seed)
    mean = (torch.randn(z_dim, generator=g) * 0.5).tolist()
    std = (torch.rand(z_dim, generator=g) * 2 + 0.5).tolist()
    return mean, std


TINY_A = TinyWan(
    name="tiny-a",
    transformer=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
                     out_channels=4, text_dim=32, freq_dim=16, ffn_dim=32, num_layers=2,
                     cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=256),
    vae=dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
             temperal_downsample=[False, True, True], dropout=0.0),
)
TINY_B = TinyWan(
    name="tiny-b",
    transformer=dict(patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=16, in_channels=8,
                     out_channels=8, text_dim=32, freq_dim=32, ffn_dim=48, num_layers=3,
                     cross_attn_norm=False, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=256),
    vae=dict(base_dim=8, z_dim=8, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
             temperal_downsample=[False, True, True], dropout=0.0),
)
CONFIGS = (TINY_A, TINY_B)


def _perturb(module: torch.nn.Module, seed: int) -> None:
    # diffusers zero-initialises some projections; random values keep every path live.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def write_tiny_wan(folder: Path, spec: TinyWan, seed: int = 0, flow_shift: float = 3.0) -> Path:
    """Save a WanPipeline folder for `spec` with diffusers' own save_pretrained."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(**spec.transformer).eval()
    _perturb(transformer, seed)
    mean, std = _latent_stats(spec.vae["z_dim"], seed)
    vae = AutoencoderKLWan(**spec.vae, latents_mean=mean, latents_std=std).eval()
    _perturb(vae, seed + 1)
    tokenizer = train_t5_tokenizer()
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **spec.text_encoder)).eval()
    scheduler = UniPCMultistepScheduler(**{**_scheduler_kwargs(), "flow_shift": flow_shift})
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae, scheduler=scheduler)
    pipe.save_pretrained(str(folder))
    return folder


def _scheduler_kwargs() -> dict:
    return {k: v for k, v in WAN21_SCHEDULER.items() if not k.startswith("_")}
