"""Tiny Flux2 Klein checkpoints written by diffusers + transformers (random weights, offline tokenizer).

The folders are saved by `Flux2KleinPipeline.save_pretrained` itself, so loading them also tests our
checkpoint reader. The Qwen3 encoder has 28 layers because the pipeline's default embedding reads
hidden states 9, 18 and 27; it is narrow (hidden 16), so the transformer's text width is 48.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tests.helpers.weights import scale_params
from vidloom.demo.tokenizer import train_chat_tokenizer
from vidloom.families.flux2.demo import CHAT_TEMPLATE, CORPUS, SPECIALS  # flux2-klein-demo's tokenizer

SCHEDULER = dict(
    num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
    base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential",
)


@dataclass(frozen=True)
class TinyFlux2:
    name: str
    distilled: bool
    transformer: dict
    vae: dict
    text_hidden: int = 16


def flux2_dit(in_channels: int, layers: int, single_layers: int, head_dim: int, heads: int, text_width: int,
              time_channels: int, rope_axis: int) -> dict:
    """Flux2Transformer2DModel keyword arguments: 1x1 patches, four equal RoPE axes, no guidance embedding (Klein)."""
    return dict(patch_size=1, in_channels=in_channels, num_layers=layers, num_single_layers=single_layers,
                attention_head_dim=head_dim, num_attention_heads=heads, joint_attention_dim=text_width,
                timestep_guidance_channels=time_channels, axes_dims_rope=(rope_axis,) * 4, guidance_embeds=False)


def flux2_vae(channels: tuple[int, ...], latent_channels: int, groups: int) -> dict:
    """AutoencoderKLFlux2 keyword arguments: one level per entry of `channels`, one layer per block."""
    return dict(block_out_channels=channels, layers_per_block=1, latent_channels=latent_channels,
                norm_num_groups=groups, down_block_types=("DownEncoderBlock2D",) * len(channels),
                up_block_types=("UpDecoderBlock2D",) * len(channels))


TINY_DISTILLED = TinyFlux2(
    name="klein-distilled",
    distilled=True,
    transformer=flux2_dit(in_channels=16, layers=1, single_layers=2, head_dim=16, heads=2, text_width=48,
                          time_channels=32, rope_axis=4),
    vae=flux2_vae(channels=(8, 16), latent_channels=4, groups=4),
)
TINY_BASE = TinyFlux2(
    name="klein-base",
    distilled=False,
    transformer=flux2_dit(in_channels=32, layers=2, single_layers=1, head_dim=8, heads=3, text_width=48,
                          time_channels=16, rope_axis=2),
    vae=flux2_vae(channels=(8, 8, 16), latent_channels=8, groups=4),
)
CONFIGS = (TINY_DISTILLED, TINY_BASE)


def train_qwen_tokenizer(specials: tuple[str, ...] = SPECIALS, corpus: tuple[str, ...] | list[str] = CORPUS,
                         vocab_size: int = 300, chat_template: str = CHAT_TEMPLATE):
    """A byte-level BPE trained offline on `corpus`, saved as a Qwen2 tokenizer with a chat template
    (flux2-klein-demo's by default)."""
    return train_chat_tokenizer(corpus, specials, chat_template, vocab_size=vocab_size)


def build_tiny_pipeline(spec: TinyFlux2, seed: int = 0):
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(**spec.transformer).eval()
    scale_params(transformer, ("timestep_embedder", "modulation"), 4.0)
    scale_params(transformer, ("context_embedder", "add_q_proj", "add_k_proj", "add_v_proj"), 10.0)
    scale_params(transformer, ("proj_out",), 6.0)
    vae = AutoencoderKLFlux2(**spec.vae).eval()
    g = torch.Generator().manual_seed(seed + 1)
    vae.bn.running_mean.copy_(torch.randn(vae.bn.running_mean.shape, generator=g) * 0.3)
    vae.bn.running_var.copy_(torch.rand(vae.bn.running_var.shape, generator=g) + 0.5)
    tokenizer = train_qwen_tokenizer()
    h = spec.text_hidden
    text_encoder = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=h, intermediate_size=2 * h, num_hidden_layers=28,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=1024,
        tie_word_embeddings=True,
    )).eval()
    scale_params(text_encoder, ("embed_tokens",), 20.0)
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER)
    return Flux2KleinPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                              transformer=transformer, is_distilled=spec.distilled)


def write_tiny_flux2(folder: Path, spec: TinyFlux2, seed: int = 0) -> Path:
    build_tiny_pipeline(spec, seed).save_pretrained(str(folder))
    return folder
