"""Tiny SANA-WM pipeline folders written by diffusers + transformers (random weights, offline tokenizer).

`SanaWMPipeline.save_pretrained` writes them (tokenizer, Gemma-2 text_encoder, LTX-2 vae, transformer,
scheduler), so loading them also tests our checkpoint reader. Two configs differ where our code branches:
GDN/softmax block mix, K-only vs Q/K/V short convolutions, head counts and the chunk-plucker blocks.

Random init leaves the camera paths inert (the plucker embedder is zero-initialised, the camera-branch
output projection is small), so `_scale` makes them loud: a wrong camera path then moves the output clearly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tests.helpers.ltx2_vae_fixtures import VAE_A, TinyVideoVAE, build_video_vae
from tests.helpers.weights import scale_params

# The chi prompt is in the corpus so the offline BPE keeps the pipeline's default prefix short in tokens.
CHI_PROMPT = (
    'Given a user prompt, generate an "Enhanced prompt" that provides detailed visual descriptions suitable '
    "for image generation. Evaluate the level of detail in the user prompt:"
)
CORPUS = [
    "a car driving across a vast desert plain at golden hour",
    "a quiet forest path with morning fog and tall pine trees",
    "a city street at night with neon signs and rain",
    "waves crash on a rocky beach at sunset",
    "User Prompt: Enhanced: Please generate only the enhanced description for the prompt below",
    "If the prompt is simple, focus on adding specifics about colors, shapes, sizes, textures, and spatial "
    "relationships to create vivid and concrete scenes. If the prompt is already detailed, refine and enhance "
    "the existing details slightly without overcomplicating. Here are examples of how to transform or refine "
    "prompts: A cat sleeping A small, fluffy white cat curled up in a round shape, sleeping peacefully on a "
    "warm sunny windowsill, surrounded by pots of blooming red flowers. A busy city street A bustling city "
    "street scene at dusk, featuring glowing street lamps, a diverse crowd of people in colorful clothing, and "
    "a double-decker bus passing by towering glass skyscrapers. avoid including any additional commentary or "
    "evaluations",
    CHI_PROMPT,
]


@dataclass(frozen=True)
class TinySanaWM:
    """One tiny SanaWMTransformer3DModel configuration plus the VAE and text encoder sizes it pairs with."""

    name: str
    transformer: dict
    vae: TinyVideoVAE = VAE_A
    text_hidden: int = 16
    text_layers: int = 2
    refiner: dict | None = None  # SanaWMLTX2RefinerTransformer3DModel kwargs (an LTX-2 DiT), or no refiner


# The stage-2 refiner's LTX-2 DiT: video in/out channels match the VAE latent (8); it must project the
# caption (use_prompt_embeddings) and has no LTX-2.3 cross-attention AdaLN (the refiner forward skips it).
REFINER_CONNECTORS = dict(
    video_connector_num_attention_heads=2, video_connector_attention_head_dim=8, video_connector_num_layers=1,
    video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=2,
    audio_connector_attention_head_dim=8, audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
    connector_rope_base_seq_len=32, rope_double_precision=False, rope_type="split",
)
REFINER_TEXT_TOKENS = 32  # SanaWMLTX2Refiner's text_max_sequence_length (the real one pads to 1024)


SANA_WM_A = TinySanaWM(
    name="sana-wm-a",
    transformer=dict(
        in_channels=8, num_layers=2, hidden_size=64, num_attention_heads=2, linear_head_dim=32,
        softmax_every_n=2, mlp_ratio=2.0, chunk_plucker_channels=48, chunk_plucker_post_attn_blocks=20,
        conv_kernel_size=4, k_conv_only=True, t_kernel_size=3, caption_channels=16,
    ),
    refiner=dict(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=4,
        audio_cross_attention_dim=8, num_layers=2, rope_double_precision=False, rope_type="split",
        vae_scale_factors=(8, 32, 32), pos_embed_max_pos=20,
    ),
)
SANA_WM_B = TinySanaWM(
    name="sana-wm-b",
    transformer=dict(
        in_channels=8, num_layers=3, hidden_size=48, num_attention_heads=4, linear_head_dim=24,
        softmax_every_n=3, mlp_ratio=1.5, chunk_plucker_channels=48, chunk_plucker_post_attn_blocks=2,
        conv_kernel_size=3, k_conv_only=False, t_kernel_size=3, caption_channels=24,
    ),
    text_hidden=24,
    refiner=dict(
        in_channels=8, out_channels=8, num_attention_heads=3, attention_head_dim=8, cross_attention_dim=24,
        audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=6,
        audio_cross_attention_dim=12, num_layers=3, rope_double_precision=True, rope_type="interleaved",
        gated_attn=True, vae_scale_factors=(8, 32, 32), pos_embed_max_pos=16,
    ),
)
CONFIGS = (SANA_WM_A, SANA_WM_B)


def train_gemma_tokenizer():
    """A BPE trained offline on CORPUS, saved as a Gemma tokenizer (bos/eos/pad like Gemma's)."""
    from vidloom.demo.tokenizer import train_gemma_tokenizer as train

    return train(CORPUS, vocab_size=600, model_max_length=4096)


def tiny_gemma2(vocab: int, hidden: int, layers: int):
    from transformers import Gemma2Config, Gemma2Model

    config = Gemma2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                          max_position_embeddings=4096, sliding_window=64)
    return Gemma2Model(config).eval()


# The GDN blocks' temporal short convolutions, zero at init (main and camera branches).
SHORT_CONVS = tuple(f"conv_{x}{cam}.weight" for x in "qkv" for cam in ("", "_cam"))


def build_transformer(spec: TinySanaWM, seed: int = 0):
    from diffusers import SanaWMTransformer3DModel

    torch.manual_seed(seed)
    model = SanaWMTransformer3DModel(**spec.transformer).eval()
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        # Zero-initialised or near-inert camera paths get real values (see the module docstring).
        for p in (model.plucker_embedder.proj.weight, model.plucker_embedder.proj.bias):
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        for name, p in model.named_parameters():
            if name.endswith(SHORT_CONVS):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    scale_params(model, ("out_proj_cam", "plucker_proj"), 3.0)
    scale_params(model, ("t_block", "scale_shift_table", "y_embedder"), 2.0)
    scale_params(model, ("cross_attn.proj",), 6.0)  # the prompt must move the video, not vanish in the residual
    return model


def build_components(spec: TinySanaWM, seed: int = 0) -> dict:
    from diffusers import FlowMatchEulerDiscreteScheduler

    tokenizer = train_gemma_tokenizer()
    torch.manual_seed(seed)
    text_encoder = tiny_gemma2(len(tokenizer) + 3, spec.text_hidden, spec.text_layers)
    scale_params(text_encoder, ("embed_tokens",), 5.0)
    return dict(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=build_video_vae(spec.vae, seed + 2),
        transformer=build_transformer(spec, seed + 1),
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
    )


def build_tiny_pipeline(spec: TinySanaWM, seed: int = 0):
    from diffusers import SanaWMPipeline

    pipe = SanaWMPipeline(**build_components(spec, seed))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def write_tiny_sana_wm(folder: Path, spec: TinySanaWM, seed: int = 0) -> Path:
    build_tiny_pipeline(spec, seed).save_pretrained(str(folder))
    return folder


def build_refiner(spec: TinySanaWM, vae=None, seed: int = 0):
    """SanaWMLTX2Refiner (stage 2): LTX-2 refiner DiT, LTX-2 text connectors, a Gemma-3 encoder, Euler scheduler."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SanaWMLTX2Refiner, SanaWMLTX2RefinerTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    from tests.helpers.ltx2_checkpoints import tiny_gemma3

    if spec.refiner is None:
        raise ValueError(f"{spec.name} has no refiner config")
    tokenizer = train_gemma_tokenizer()
    text_hidden, text_layers = 16, 2
    torch.manual_seed(seed + 11)
    text_encoder = tiny_gemma3(len(tokenizer) + 3, text_hidden, text_layers)
    scale_params(text_encoder, ("embed_tokens",), 5.0)
    torch.manual_seed(seed + 12)
    transformer = SanaWMLTX2RefinerTransformer3DModel(caption_channels=text_hidden, **spec.refiner).eval()
    # Louder timestep/prompt conditioning: a wrong sigma or prompt path then moves the refined latents clearly.
    scale_params(transformer, ("time_embed", "scale_shift_table"), 3.0)
    scale_params(transformer, ("caption_projection", "attn2.to_out"), 4.0)
    torch.manual_seed(seed + 13)
    connectors = LTX2TextConnectors(caption_channels=text_hidden, text_proj_in_factor=text_layers + 1,
                                    **REFINER_CONNECTORS).eval()
    refiner = SanaWMLTX2Refiner(
        transformer=transformer, connectors=connectors, tokenizer=tokenizer, text_encoder=text_encoder,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0), vae=vae,
        text_max_sequence_length=REFINER_TEXT_TOKENS,
    )
    refiner.set_progress_bar_config(disable=True)
    return refiner


def write_tiny_refiner(folder: Path, spec: TinySanaWM, seed: int = 0) -> Path:
    """The refiner beside stage 1, in `<folder>/refiner/` (a SanaWMLTX2Refiner folder without its own VAE)."""
    build_refiner(spec, None, seed).save_pretrained(str(folder / "refiner"))
    return folder / "refiner"
