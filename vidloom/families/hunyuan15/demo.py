"""hunyuan15-demo: the HunyuanVideo-1.5 architecture at a tiny size with seeded random weights.

Text and image to video with the saved guider's CFG. Written once into the user's cache as a
HunyuanVideo15ImageToVideoPipeline folder (our own transformer and VAE; a narrow Qwen2.5-VL text model, a ByT5
encoder and a SigLIP vision tower built by transformers; a tokenizer trained offline, ByT5's byte tokenizer) and
loaded through the same loader as real checkpoints. Its weights are random: the videos are noise.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from vidloom.core.card import ModelCard, SamplingDefaults
from vidloom.demo.cache import DemoCheckpoint, noise_note, write_json
from vidloom.demo.tokenizer import CHATML_TEMPLATE, train_chat_tokenizer
from vidloom.demo.writer import Part, model_index, write_parts, write_pipeline_files
from vidloom.layers.attention import attention
from vidloom.loading.name_map import NameMap
from vidloom.families.hunyuan15.cards import hunyuan15_card
from vidloom.families.hunyuan15.text import SYSTEM_MESSAGE
from vidloom.families.hunyuan15.transformer import (
    HUNYUAN15_TRANSFORMER_NAME_MAP, Hunyuan15Transformer, Hunyuan15TransformerConfig,
)
from vidloom.families.hunyuan15.vae import Hunyuan15VAE

DEMO_ID = "hunyuan15-demo"
DEMO_VERSION = 1  # bump when the demo's architecture or files change
DEMO_SEED = 20261206
DEMO_NOTE = noise_note(DEMO_ID, "HunyuanVideo-1.5", "hunyuanvideo-community/HunyuanVideo-1.5-480p_i2v")

TEXT_HIDDEN, GLYPH_DIM, IMAGE_DIM = 32, 16, 16
DEMO_TEXT_ENCODER = dict(hidden_size=TEXT_HIDDEN, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                         num_key_value_heads=1, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                                                 "mrope_section": [4, 2, 2]})
DEMO_GLYPH = dict(d_model=GLYPH_DIM, d_kv=8, d_ff=32, num_layers=2, num_heads=2, feed_forward_proj="gated-gelu")
DEMO_VISION = dict(hidden_size=IMAGE_DIM, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                   image_size=32, patch_size=8)
DEMO_TRANSFORMER = {
    "_class_name": "HunyuanVideo15Transformer3DModel", "in_channels": 9, "out_channels": 4,
    "num_attention_heads": 2, "attention_head_dim": 16, "num_layers": 2, "num_refiner_layers": 1, "mlp_ratio": 2.0,
    "patch_size": 1, "patch_size_t": 1, "text_embed_dim": TEXT_HIDDEN, "text_embed_2_dim": GLYPH_DIM,
    "image_embed_dim": IMAGE_DIM, "rope_axes_dim": [4, 6, 6], "target_size": 64, "task_type": "i2v",
}
# The condition's path into the video, louder (vidloom.demo.writer.scale_parameters says why).
TEXT_SCALE = (("blocks.*.cond.k.weight", 4.0), ("blocks.*.cond.v.weight", 6.0), ("blocks.*.video.out.weight", 3.0))
# Three 2x resamples (two of them in time): 8x, 4x.
DEMO_VAE = {"_class_name": "AutoencoderKLHunyuanVideo15", "latent_channels": 4, "block_out_channels": [8, 8, 8, 8],
            "layers_per_block": 1, "spatial_compression_ratio": 8, "temporal_compression_ratio": 4}
DEMO_SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 5.0,
                  "use_dynamic_shifting": False}
DEMO_GUIDER = {"_class_name": "ClassifierFreeGuidance", "guidance_scale": 6.0, "guidance_rescale": 0.0,
               "use_original_formulation": False, "start": 0.0, "stop": 1.0}
MODEL_INDEX = model_index(
    "HunyuanVideo15ImageToVideoPipeline", feature_extractor="transformers:SiglipImageProcessor",
    guider="diffusers:ClassifierFreeGuidance", image_encoder="transformers:SiglipVisionModel",
    scheduler="diffusers:FlowMatchEulerDiscreteScheduler", text_encoder="transformers:Qwen2_5_VLTextModel",
    text_encoder_2="transformers:T5EncoderModel", tokenizer="transformers:Qwen2Tokenizer",
    tokenizer_2="transformers:ByT5Tokenizer", transformer="diffusers:HunyuanVideo15Transformer3DModel",
    vae="diffusers:AutoencoderKLHunyuanVideo15",
)
# The tokenizer's specials (the first is the pad) and the sentences its vocabulary is counted from.
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CORPUS = (SYSTEM_MESSAGE, "system user assistant", "a cat walks on the grass, realistic",
          'a sign that says "open"', "a red fox jumps over the lazy dog in the snow", "blurry, low quality, dark")
DEMO_DEFAULTS = SamplingDefaults(height=48, width=80, num_frames=9, fps=8, num_inference_steps=8,
                                 guidance_scale=DEMO_GUIDER["guidance_scale"], flow_shift=DEMO_SCHEDULER["shift"],
                                 sampler="euler", negative_prompt="")


def demo_card() -> ModelCard:
    return hunyuan15_card(DEMO_ID, f"demo:{DEMO_ID}", multiple=DEMO_VAE["spatial_compression_ratio"],
                          temporal=DEMO_VAE["temporal_compression_ratio"], defaults=DEMO_DEFAULTS,
                          description="HunyuanVideo-1.5 (text and image to video) at a tiny size, random weights",
                          notes=(DEMO_NOTE,), precision="float32", i2v=None)


def write_demo_checkpoint(folder: Path) -> None:
    """A HunyuanVideo15ImageToVideoPipeline folder from our own modules (diffusers can load it too)."""
    torch.manual_seed(DEMO_SEED)
    write_parts(folder, (
        Part("transformer", _transformer, HUNYUAN15_TRANSFORMER_NAME_MAP, DEMO_TRANSFORMER, scale=TEXT_SCALE),
        Part("vae", lambda: Hunyuan15VAE.from_config(DEMO_VAE), NameMap(())),
    ))
    tokenizer = train_chat_tokenizer(CORPUS, SPECIALS, CHATML_TEMPLATE, vocab_size=300)
    _write_encoders(folder, len(tokenizer))
    write_json(folder / "guider" / "guider_config.json", DEMO_GUIDER)
    write_pipeline_files(folder, DEMO_SCHEDULER, MODEL_INDEX, tokenizer)


def _transformer() -> Hunyuan15Transformer:
    return Hunyuan15Transformer(Hunyuan15TransformerConfig.from_diffusers(DEMO_TRANSFORMER), attention)


def _write_encoders(folder: Path, vocab_size: int) -> None:
    from transformers import (
        ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, SiglipImageProcessor, SiglipVisionConfig,
        SiglipVisionModel, T5Config, T5EncoderModel,
    )

    torch.manual_seed(DEMO_SEED + 2)
    text = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**DEMO_TEXT_ENCODER, vocab_size=vocab_size))
    with torch.no_grad():  # loud embeddings: the prompt moves the video instead of vanishing in the norms
        text.get_input_embeddings().weight.mul_(10.0)
    text.save_pretrained(str(folder / "text_encoder"))
    glyph_tokenizer = ByT5Tokenizer()
    T5EncoderModel(T5Config(vocab_size=len(glyph_tokenizer), **DEMO_GLYPH)).save_pretrained(str(folder / "text_encoder_2"))
    glyph_tokenizer.save_pretrained(str(folder / "tokenizer_2"))
    SiglipVisionModel(SiglipVisionConfig(**DEMO_VISION)).save_pretrained(str(folder / "image_encoder"))
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(str(folder / "feature_extractor"))


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
