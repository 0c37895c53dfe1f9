"""Tiny LTX-2 pipeline folders written by diffusers + transformers (random weights, offline tokenizer).

`LTX2Pipeline.save_pretrained` writes them, so loading them also tests our checkpoint reader. Two
configs differ where our code branches: rotary layout (split / interleaved), learnable registers in
the text connectors, gated attention and the cross-attention AdaLN of LTX-2.3 (`cross_attn_mod`),
patch sizes and the text width.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tests.helpers.ltx2_audio_fixtures import build_audio_vae, build_vocoder
from tests.helpers.ltx2_vae_fixtures import (
    UPSAMPLER_A, UPSAMPLER_B, VAE_A, VAE_B, TinyUpsampler, TinyVideoVAE, build_upsampler, build_video_vae,
)
from tests.helpers.weights import scale_params
from vidloom.models.ltx2.demo_parts import CORPUS  # ltx2-demo's tokenizer corpus

# The LTX-2 scheduler config (Lightricks/LTX-2 scheduler/scheduler_config.json keys the pipeline reads).
SCHEDULER = dict(
    num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
    base_image_seq_len=1024, max_image_seq_len=4096, shift_terminal=0.1,
)


# A timestep-conditioned decoder (the decode mixes in noise from the request's generator) without the
# per-block noise injection, which diffusers draws from torch's global RNG (no seed can pin it).
VAE_TIMESTEP = TinyVideoVAE(name="ltx2-vae-timestep", config={**VAE_A.config, "timestep_conditioning": True},
                            video_shape=VAE_A.video_shape, latent_shape=VAE_A.latent_shape)


@dataclass(frozen=True)
class TinyLTX2:
    name: str
    transformer: dict
    connectors: dict
    vae: TinyVideoVAE
    upsampler: TinyUpsampler
    audio_vae: str  # ltx2_audio_fixtures.AUDIO_VAE_CONFIGS key
    vocoder: str  # ltx2_audio_fixtures.VOCODER_CONFIGS key
    text_hidden: int = 16
    text_layers: int = 2


TINY_SPLIT = TinyLTX2(
    name="ltx2-split",
    transformer=dict(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=16, audio_out_channels=16, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, rope_double_precision=False,
        rope_type="split",
    ),
    connectors=dict(
        video_connector_num_attention_heads=4, video_connector_attention_head_dim=4, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=4, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_double_precision=False,
        rope_type="split",
    ),
    vae=VAE_TIMESTEP,
    upsampler=UPSAMPLER_A,
    audio_vae="causal-pixel",
    vocoder="hifigan",
)
TINY_INTERLEAVED = TinyLTX2(
    name="ltx2-interleaved",
    transformer=dict(
        in_channels=16, out_channels=16, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=12,
        cross_attention_dim=24, audio_in_channels=32, audio_out_channels=32, audio_num_attention_heads=3,
        audio_attention_head_dim=4, audio_cross_attention_dim=12, num_layers=3, rope_double_precision=True,
        rope_type="interleaved", gated_attn=True, audio_gated_attn=True, cross_attn_mod=True,
        audio_cross_attn_mod=True, perturbed_attn=True, pos_embed_max_pos=16, audio_pos_embed_max_pos=24,
    ),
    connectors=dict(
        video_connector_num_attention_heads=3, video_connector_attention_head_dim=8, video_connector_num_layers=2,
        video_connector_num_learnable_registers=8, audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=12, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=8, connector_rope_base_seq_len=64, rope_double_precision=True,
        rope_type="interleaved", video_gated_attn=True,
    ),
    vae=VAE_B,
    upsampler=UPSAMPLER_B,
    audio_vae="group-attention",
    vocoder="bwe",
    text_hidden=24,
    text_layers=3,
)
CONFIGS = (TINY_SPLIT, TINY_INTERLEAVED)


def train_gemma_tokenizer():
    """A BPE trained offline on CORPUS, saved as a Gemma tokenizer (bos/eos/pad like Gemma's)."""
    from vidloom.demo.tokenizer import train_gemma_tokenizer as train

    return train(CORPUS, vocab_size=200, model_max_length=1024)


def tiny_gemma3(vocab: int, hidden: int, layers: int):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=256,
                sliding_window=8, rope_theta=10000.0)
    vision = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                  image_size=16, patch_size=8)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=vocab - 1,
                          boi_token_index=vocab - 2, eoi_token_index=vocab - 3)
    return Gemma3ForConditionalGeneration(config).eval()


def build_components(spec: TinyLTX2, seed: int = 0) -> dict:
    """The pipeline's components; the video VAE, audio VAE and vocoder come from the other LTX-2 fixtures."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    tokenizer = train_gemma_tokenizer()
    torch.manual_seed(seed)
    text_encoder = tiny_gemma3(len(tokenizer) + 3, spec.text_hidden, spec.text_layers)
    scale_params(text_encoder, ("embed_tokens",), 5.0)
    torch.manual_seed(seed)
    transformer = LTX2VideoTransformer3DModel(caption_channels=spec.text_hidden, **spec.transformer).eval()
    scale_params(transformer, ("time_embed", "scale_shift_table", "av_cross_attn"), 3.0)
    scale_params(transformer, ("caption_projection",), 4.0)
    scale_params(transformer, ("audio_attn2.to_out", "audio_proj_out"), 4.0)  # the prompt must move the sound too
    torch.manual_seed(seed + 1)
    connectors = LTX2TextConnectors(
        caption_channels=spec.text_hidden, text_proj_in_factor=spec.text_layers + 1, **spec.connectors
    ).eval()
    return dict(
        transformer=transformer, vae=build_video_vae(spec.vae, seed + 2),
        audio_vae=build_audio_vae(spec.audio_vae, seed + 3), scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        text_encoder=text_encoder, tokenizer=tokenizer, connectors=connectors,
        vocoder=build_vocoder(spec.vocoder, seed + 4),
    )


def build_tiny_pipeline(spec: TinyLTX2, seed: int = 0, image_to_video: bool = False):
    from diffusers import LTX2ImageToVideoPipeline, LTX2Pipeline

    cls = LTX2ImageToVideoPipeline if image_to_video else LTX2Pipeline
    pipe = cls(**build_components(spec, seed))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def write_tiny_ltx2(folder: Path, spec: TinyLTX2, seed: int = 0, image_to_video: bool = False,
                    upsampler: bool = False) -> Path:
    """The pipeline folder; with `upsampler`, also a latent_upsampler/ folder (as Lightricks/LTX-2 has)."""
    build_tiny_pipeline(spec, seed, image_to_video).save_pretrained(str(folder))
    if upsampler:
        build_upsampler(spec.upsampler, seed + 5).save_pretrained(str(folder / "latent_upsampler"))
    return folder
