"""qwen-image-demo: the Qwen-Image architecture at a tiny size with seeded random weights.

Text to image with true CFG, and edits of up to three reference images. Written once into the user's cache as a
QwenImageEditPlusPipeline folder (our own transformer and Wan-architecture VAE, a narrow Qwen2.5-VL with a one-layer
vision tower built by transformers, its image processor, a tokenizer trained offline) and loaded through the same
loader as real checkpoints; a request without images is text to image. Its weights are random: the images are noise.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from vidloom.core.card import ModelCard
from vidloom.demo.cache import DemoCheckpoint, noise_note
from vidloom.demo.tokenizer import train_chat_tokenizer
from vidloom.demo.writer import Part, latent_stats_config, model_index, write_parts, write_pipeline_files
from vidloom.layers.attention import attention
from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE
from vidloom.families.qwen_image.cards import DEFAULTS, MAX_PLUS_REFERENCE_IMAGES, qwen_image_card
from vidloom.families.qwen_image.load import vae_config
from vidloom.families.qwen_image.transformer import (
    QWEN_IMAGE_TRANSFORMER_NAME_MAP, QwenImageTransformer, QwenImageTransformerConfig,
)

DEMO_ID = "qwen-image-demo"
DEMO_VERSION = 2  # bump when the demo's architecture or files change
DEMO_SEED = 20260301
DEMO_NOTE = noise_note(DEMO_ID, "Qwen-Image", "Qwen/Qwen-Image")

# The pipeline wraps prompts in its own template (no chat template needed); these are its special tokens, then the
# vision tokens of the edit template and Qwen2-VL's processor.
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>")
CORPUS = (
    "Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of "
    "the objects and background", "system user assistant", "a cat holding a sign that says hello world",
    "a red fox jumps over the lazy dog in the snow", "an astronaut riding a horse on the moon, photorealistic",
    "a bowl of fruit on a wooden table, oil painting", "blurry, low quality, dark",
)
TEXT_HIDDEN = 32
DEMO_TEXT_ENCODER = dict(hidden_size=TEXT_HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                                                 "mrope_section": [2, 2, 4]})
DEMO_VISION = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=TEXT_HIDDEN)
DEMO_TRANSFORMER = {
    "_class_name": "QwenImageTransformer2DModel", "patch_size": 2, "in_channels": 16, "out_channels": 4,
    "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": TEXT_HIDDEN,
    "guidance_embeds": False, "axes_dims_rope": [4, 6, 6],
}
# The text's path into the image, louder (vidloom.demo.writer.scale_parameters says why).
JOINT_ATTENTION_SCALE = (("blocks.*.txt.norm_k.weight", 4.0), ("blocks.*.txt.v.weight", 6.0),
                         ("blocks.*.img.out.weight", 4.0))
# Three 2x downsamples (two of them in time, unused for an image): 8x as the real VAE, then the 2x2 patches: sizes
# divide by 16, and an edit's ~1024^2 reference is 64x64 tokens.
DEMO_VAE = {
    "_class_name": "AutoencoderKLQwenImage", "base_dim": 8, "z_dim": 4, "dim_mult": [1, 2, 2, 2],
    "num_res_blocks": 1, "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0,
    "input_channels": 3,
    **latent_stats_config(DEMO_SEED + 1, 4),
}
SIZE_MULTIPLE = 2 ** len(DEMO_VAE["temperal_downsample"]) * DEMO_TRANSFORMER["patch_size"]
# Qwen/Qwen-Image's scheduler_config.json.
DEMO_SCHEDULER = {
    "_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 1.0,
    "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 0.9, "base_image_seq_len": 256,
    "max_image_seq_len": 8192, "shift_terminal": 0.02, "time_shift_type": "exponential", "invert_sigmas": False,
    "stochastic_sampling": False, "use_karras_sigmas": False, "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
}
MODEL_INDEX = model_index(
    "QwenImageEditPlusPipeline", scheduler="diffusers:FlowMatchEulerDiscreteScheduler",
    text_encoder="transformers:Qwen2_5_VLForConditionalGeneration", tokenizer="transformers:Qwen2Tokenizer",
    processor="transformers:Qwen2VLProcessor", transformer="diffusers:QwenImageTransformer2DModel",
    vae="diffusers:AutoencoderKLQwenImage",
)
# Qwen2-VL's image processor, bounded small: the VL model sees a reference as at most 16 merged patches.
DEMO_PROCESSOR = dict(min_pixels=56 * 56, max_pixels=28 * 28 * 16, patch_size=14, temporal_patch_size=2, merge_size=2)
DEMO_DEFAULTS = dataclasses.replace(DEFAULTS, height=64, width=64, num_inference_steps=8)


def demo_card() -> ModelCard:
    return qwen_image_card(DEMO_ID, f"demo:{DEMO_ID}", multiple=SIZE_MULTIPLE, defaults=DEMO_DEFAULTS,
                           description="Qwen-Image (text to image with true CFG, edits of 1-3 images) at a tiny size, "
                                       "random weights",
                           notes=(DEMO_NOTE,), precision="float32", edit=MAX_PLUS_REFERENCE_IMAGES, plus=True,
                           edit_optional=True)


def write_demo_checkpoint(folder: Path) -> None:
    """A QwenImageEditPlusPipeline folder from our own modules (diffusers can load it too)."""
    torch.manual_seed(DEMO_SEED)
    write_parts(folder, (
        Part("transformer", _transformer, QWEN_IMAGE_TRANSFORMER_NAME_MAP, DEMO_TRANSFORMER,
             scale=JOINT_ATTENTION_SCALE),
        Part("vae", lambda: WanVAE(vae_config(DEMO_VAE)), WAN_VAE_NAME_MAP, DEMO_VAE),
    ))
    tokenizer = train_chat_tokenizer(CORPUS, SPECIALS, "", vocab_size=300)
    _write_text_encoder(folder / "text_encoder", tokenizer)
    from transformers import Qwen2VLImageProcessorPil

    Qwen2VLImageProcessorPil(**DEMO_PROCESSOR).save_pretrained(str(folder / "processor"))
    write_pipeline_files(folder, DEMO_SCHEDULER, MODEL_INDEX, tokenizer)


def _transformer() -> QwenImageTransformer:
    return QwenImageTransformer(QwenImageTransformerConfig.from_diffusers(DEMO_TRANSFORMER), attention)


def _write_text_encoder(folder: Path, tokenizer: Any) -> None:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(DEMO_SEED + 2)
    vocab_size, ids = len(tokenizer), tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(text_config={**DEMO_TEXT_ENCODER, "vocab_size": vocab_size}, vision_config=DEMO_VISION,
                              vocab_size=vocab_size, hidden_size=TEXT_HIDDEN, image_token_id=ids("<|image_pad|>"),
                              video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                              vision_end_token_id=ids("<|vision_end|>"))
    model = Qwen2_5_VLForConditionalGeneration(config)
    with torch.no_grad():  # loud embeddings: the prompt moves the image instead of vanishing in the norms
        model.get_input_embeddings().weight.mul_(20.0)
    model.save_pretrained(str(folder))


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
