"""flux2-klein-demo: the Flux2 Klein architecture at a tiny size with seeded random weights.

Text to image and edits with reference images, through the step-distilled Klein recipe (4 steps, no
CFG). Written once into the user's cache as a Flux2KleinPipeline folder (our own transformer and VAE,
a 28-layer but narrow Qwen3 text encoder built by transformers, a tokenizer trained offline) and loaded
through the same loader as real checkpoints. Its weights are random: the images are noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.layers.attention import attention
from vidloom.families.flux2.transformer import FLUX2_TRANSFORMER_NAME_MAP, Flux2Transformer, Flux2TransformerConfig
from vidloom.families.flux2.vae import FLUX2_VAE_NAME_MAP, Flux2VAE, Flux2VAEConfig
from vidloom.demo.cache import DemoCheckpoint, noise_note
from vidloom.demo.tokenizer import train_chat_tokenizer
from vidloom.demo.writer import Part, model_index, write_parts, write_pipeline_files
from vidloom.families.flux2.cards import DISTILLED_DEFAULTS, flux2_card
from vidloom.families.flux2.text import FLUX2_TEXT_LAYERS

DEMO_ID = "flux2-klein-demo"
DEMO_VERSION = 2  # bump when the demo's architecture or files change
DEMO_SEED = 20260115
DEMO_NOTE = noise_note(DEMO_ID, "Flux2 Klein", "black-forest-labs/FLUX.2-klein-4B")

# Qwen3's template with the thinking switch the Klein prompt encoder turns off.
CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
CORPUS = (
    "a red fox jumps over the lazy dog in the snow", "a cat holding a sign that says hello world",
    "an astronaut riding a horse on the moon, photorealistic", "a bowl of fruit on a wooden table, oil painting",
    "make the sky purple and add a rainbow", "user assistant system think",
)
TEXT_HIDDEN = 16
# Klein reads hidden states 9, 18 and 27: the encoder needs 28 layers; narrow, so text width is 3 x 16.
DEMO_TEXT_ENCODER = {
    "hidden_size": TEXT_HIDDEN, "intermediate_size": 2 * TEXT_HIDDEN, "num_hidden_layers": max(FLUX2_TEXT_LAYERS) + 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}
DEMO_TRANSFORMER = {
    "_class_name": "Flux2Transformer2DModel",
    "patch_size": 1, "in_channels": 16, "num_layers": 1, "num_single_layers": 2, "attention_head_dim": 16,
    "num_attention_heads": 2, "joint_attention_dim": len(FLUX2_TEXT_LAYERS) * TEXT_HIDDEN,
    "timestep_guidance_channels": 32, "axes_dims_rope": [4, 4, 4, 4], "guidance_embeds": False,
}
# The text's path into the image, louder: text keys x4 (the prompt's ~20 tokens then outweigh the 512-token
# padding they share the joint attention with), text values x8 and the image's attention output x6 (the text
# reaches the image only through it). At default init the prompt moved the image by 1 level of 255.
JOINT_ATTENTION_SCALE = (("double_blocks.*.txt_norm_k.weight", 4.0), ("double_blocks.*.txt_v.weight", 8.0),
                         ("double_blocks.*.img_out.weight", 6.0))
# Two levels (2x down) then Flux2's 2x2 patchify: 4 latent channels become the transformer's 16.
DEMO_VAE = {
    "_class_name": "AutoencoderKLFlux2",
    "block_out_channels": [8, 16], "layers_per_block": 1, "latent_channels": 4, "norm_num_groups": 4,
    "down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2,
}
SIZE_MULTIPLE = 2 ** (len(DEMO_VAE["block_out_channels"]) - 1) * 2
# FLUX.2-klein's scheduler_config.json (dynamic, exponential time shift).
DEMO_SCHEDULER = {
    "_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0,
    "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
    "max_image_seq_len": 4096, "time_shift_type": "exponential",
}
MODEL_INDEX = model_index(
    "Flux2KleinPipeline",
    is_distilled=True, scheduler="diffusers:FlowMatchEulerDiscreteScheduler",
    text_encoder="transformers:Qwen3ForCausalLM", tokenizer="transformers:Qwen2TokenizerFast",
    transformer="diffusers:Flux2Transformer2DModel", vae="diffusers:AutoencoderKLFlux2",
)
DEMO_DEFAULTS = dataclasses.replace(DISTILLED_DEFAULTS, height=64, width=64)


def demo_card() -> ModelCard:
    return flux2_card(
        DEMO_ID, f"demo:{DEMO_ID}", distilled=True, multiple=SIZE_MULTIPLE, defaults=DEMO_DEFAULTS,
        description="Flux2 Klein (text to image, edits with reference images) at a tiny size, random weights",
        notes=(DEMO_NOTE,), precision="float32",
    )


def write_demo_checkpoint(folder: Path) -> None:
    """A Flux2KleinPipeline folder from our own modules (diffusers can load it too)."""
    torch.manual_seed(DEMO_SEED)
    write_parts(folder, (
        Part("transformer", _transformer, FLUX2_TRANSFORMER_NAME_MAP, DEMO_TRANSFORMER, scale=JOINT_ATTENTION_SCALE),
        Part("vae", lambda: Flux2VAE(Flux2VAEConfig.from_diffusers(DEMO_VAE)), FLUX2_VAE_NAME_MAP, DEMO_VAE,
             latent_seed=DEMO_SEED + 1, latent_buffers=("latent_mean", "latent_var")),
    ))
    tokenizer = train_chat_tokenizer(CORPUS, SPECIALS, CHAT_TEMPLATE, vocab_size=300)
    _write_text_encoder(folder / "text_encoder", len(tokenizer))
    write_pipeline_files(folder, DEMO_SCHEDULER, MODEL_INDEX, tokenizer)


def _transformer() -> Flux2Transformer:
    return Flux2Transformer(Flux2TransformerConfig.from_diffusers(DEMO_TRANSFORMER), attention)


def _write_text_encoder(folder: Path, vocab_size: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(DEMO_SEED + 2)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab_size, **DEMO_TEXT_ENCODER))
    with torch.no_grad():  # loud embeddings: the prompt moves the image instead of vanishing in the norms
        model.model.embed_tokens.weight.mul_(20.0)
    model.save_pretrained(str(folder))


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
