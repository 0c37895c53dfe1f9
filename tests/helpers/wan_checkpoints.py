"""Tiny Wan2.1 checkpoints written by diffusers + transformers (random weights, offline tokenizer).

These are the reference side of parity tests: the folders are produced by the
reference libraries themselves, so loading them also tests our checkpoint reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from vidloom.demo.tokenizer import train_t5_tokenizer
from vidloom.demo.writer import latent_stats_config
from vidloom.families.wan.demo import WAN21_SCHEDULER


@dataclass(frozen=True)
class TinyWan:
    """One tiny configuration of the real architecture."""

    name: str
    transformer: dict
    vae: dict
    text_encoder: dict = field(default_factory=lambda: dict(TINY_UMT5))


TINY_UMT5 = {
    "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
    "relative_attention_num_buckets": 8, "relative_attention_max_distance": 32,
    "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0,
}


def wan_dit(heads: int, head_dim: int, channels: int, ffn_dim: int, layers: int, freq_dim: int, text_dim: int = 32,
            cross_attn_norm: bool = True, rope_max_seq_len: int = 256) -> dict:
    """WanTransformer3DModel keyword arguments: 2x2 patches, RMS q/k norm across heads, the same channels in and out."""
    return dict(patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim, in_channels=channels,
                out_channels=channels, text_dim=text_dim, freq_dim=freq_dim, ffn_dim=ffn_dim, num_layers=layers,
                cross_attn_norm=cross_attn_norm, qk_norm="rms_norm_across_heads", eps=1e-6,
                rope_max_seq_len=rope_max_seq_len)


def wan_vae(base_dim: int, z_dim: int, dim_mult: list[int], num_res_blocks: int) -> dict:
    """AutoencoderKLWan keyword arguments: Wan2.1's layout (4x space per level after the first, 4x time)."""
    return dict(base_dim=base_dim, z_dim=z_dim, dim_mult=dim_mult, num_res_blocks=num_res_blocks, attn_scales=[],
                temperal_downsample=[False, True, True], dropout=0.0)


TINY_A = TinyWan(
    name="tiny-a",
    transformer=wan_dit(heads=2, head_dim=12, channels=4, ffn_dim=32, layers=2, freq_dim=16),
    vae=wan_vae(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1),
)
TINY_B = TinyWan(
    name="tiny-b",
    transformer=wan_dit(heads=3, head_dim=16, channels=8, ffn_dim=48, layers=3, freq_dim=32, cross_attn_norm=False),
    vae=wan_vae(base_dim=8, z_dim=8, dim_mult=[1, 2, 4, 4], num_res_blocks=2),
)
CONFIGS = (TINY_A, TINY_B)


def _perturb(module: torch.nn.Module, seed: int) -> None:
    # diffusers zero-initialises some projections; random values keep every path live.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def reference_transformer(kwargs: dict, seed: int) -> torch.nn.Module:
    """diffusers' WanTransformer3DModel from `kwargs`, seeded and perturbed."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(**kwargs).eval()
    _perturb(transformer, seed)
    return transformer


def reference_parts(spec: TinyWan, seed: int, vae_seed: int | None = None, text_seed: int | None = None) -> dict:
    """The VAE (seeded latent statistics, perturbed), the offline tokenizer and the UMT5 encoder every tiny Wan-VAE
    folder holds, as pipeline keyword arguments. `vae_seed`/`text_seed` reseed the global generator before that
    module is built; without them it continues from the modules built before."""
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config, UMT5EncoderModel

    if vae_seed is not None:
        torch.manual_seed(vae_seed)
    vae = AutoencoderKLWan(**spec.vae, **latent_stats_config(seed, spec.vae["z_dim"])).eval()
    _perturb(vae, seed + 1)
    tokenizer = train_t5_tokenizer()
    if text_seed is not None:
        torch.manual_seed(text_seed)
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **spec.text_encoder)).eval()
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae)


def write_tiny_wan(folder: Path, spec: TinyWan, seed: int = 0, flow_shift: float = 3.0) -> Path:
    """Save a WanPipeline folder for `spec` with diffusers' own save_pretrained."""
    from diffusers import UniPCMultistepScheduler, WanPipeline

    transformer = reference_transformer(spec.transformer, seed)
    scheduler = UniPCMultistepScheduler(**{**_scheduler_kwargs(), "flow_shift": flow_shift})
    pipe = WanPipeline(**reference_parts(spec, seed), transformer=transformer, scheduler=scheduler)
    pipe.save_pretrained(str(folder))
    return folder


def _scheduler_kwargs() -> dict:
    return {k: v for k, v in WAN21_SCHEDULER.items() if not k.startswith("_")}
