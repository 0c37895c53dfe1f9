"""LTX-2 components of the demo checkpoints, at a tiny size: ltx2-demo holds them, and SANA-WM's demo reuses
the video VAE and (in its stage-2 refiner) the DiT, the text connectors and the Gemma-3 encoder.

Seeded from LTX2_DEMO_SEED wherever they are written, so every demo holding them keeps its bytes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from vidloom.demo.tokenizer import train_gemma_tokenizer
from vidloom.demo.writer import Part
from vidloom.layers.attention import attention
from vidloom.loading.name_map import NameMap
from vidloom.models.ltx2.connectors import LTX2_CONNECTORS_NAME_MAP, LTX2ConnectorsConfig, LTX2TextConnectors
from vidloom.models.ltx2.transformer import LTX2_TRANSFORMER_NAME_MAP, LTX2Transformer, LTX2TransformerConfig

LTX2_DEMO_SEED = 20260106
CORPUS = (
    "a robot dancing in the rain", "a red fox jumps over the lazy dog in the snow",
    "a cat holding a sign that says hello world, with music playing", "waves crash on a rocky beach at sunset",
    "worst quality, inconsistent motion, blurry, jittery, distorted",
)
TEXT_HIDDEN, TEXT_LAYERS = 16, 2
DEMO_TRANSFORMER = {
    "_class_name": "LTX2VideoTransformer3DModel",
    "in_channels": 8, "out_channels": 8, "patch_size": 1, "patch_size_t": 1, "num_attention_heads": 2,
    "attention_head_dim": 8, "cross_attention_dim": 16, "caption_channels": TEXT_HIDDEN, "audio_in_channels": 16,
    "audio_out_channels": 16, "audio_num_attention_heads": 2, "audio_attention_head_dim": 4,
    "audio_cross_attention_dim": 8, "num_layers": 2, "rope_double_precision": False, "rope_type": "split",
}
# The connectors read every hidden state of the text encoder (its layers + the embeddings).
DEMO_CONNECTORS = {
    "_class_name": "LTX2TextConnectors",
    "caption_channels": TEXT_HIDDEN, "text_proj_in_factor": TEXT_LAYERS + 1,
    "video_connector_num_attention_heads": 4, "video_connector_attention_head_dim": 4,
    "video_connector_num_layers": 1, "video_connector_num_learnable_registers": None,
    "audio_connector_num_attention_heads": 4, "audio_connector_attention_head_dim": 4,
    "audio_connector_num_layers": 1, "audio_connector_num_learnable_registers": None,
    "connector_rope_base_seq_len": 32, "rope_double_precision": False, "rope_type": "split",
}
# LTX-2's stage layout (32x space, 8x time, residual 2x upsamplers) at tiny widths.
DEMO_VIDEO_VAE = {
    "_class_name": "AutoencoderKLLTX2Video",
    "latent_channels": 8, "block_out_channels": [8, 16, 32, 32], "layers_per_block": [1, 1, 1, 1, 1],
    "decoder_block_out_channels": [16, 32, 64], "decoder_layers_per_block": [1, 1, 1, 1],
    "decoder_inject_noise": [False, False, False, False], "timestep_conditioning": False,
    "spatial_compression_ratio": 32, "temporal_compression_ratio": 8,
}


def ltx2_part(folder: str, build: Callable[[], torch.nn.Module], name_map: NameMap | None,
              config: dict[str, Any]) -> Part:
    """An ltx2-demo part: latent statistics (where the module has them) drawn from a seed per folder name."""
    return Part(folder, build, name_map, config, latent_seed=LTX2_DEMO_SEED + len(folder))


def transformer_part(config: dict[str, Any]) -> Part:
    return ltx2_part("transformer", lambda: LTX2Transformer(LTX2TransformerConfig.from_diffusers(config), attention),
                     LTX2_TRANSFORMER_NAME_MAP, config)


def connectors_part() -> Part:
    return ltx2_part("connectors", lambda: LTX2TextConnectors(LTX2ConnectorsConfig.from_diffusers(DEMO_CONNECTORS)),
                     LTX2_CONNECTORS_NAME_MAP, DEMO_CONNECTORS)


def train_tokenizer() -> Any:
    return train_gemma_tokenizer(CORPUS, vocab_size=200, model_max_length=1024)


def write_text_encoder(folder: Any, vocab: int) -> None:
    """A tiny Gemma3 (the LTX-2 text encoder's class); its image tokens sit past the tokenizer's vocabulary."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = dict(vocab_size=vocab, hidden_size=TEXT_HIDDEN, intermediate_size=2 * TEXT_HIDDEN,
                num_hidden_layers=TEXT_LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                max_position_embeddings=256, sliding_window=8, rope_theta=10000.0)
    vision = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                  patch_size=8)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          image_token_index=vocab - 1, boi_token_index=vocab - 2, eoi_token_index=vocab - 3)
    torch.manual_seed(LTX2_DEMO_SEED + 1)
    model = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():  # loud embeddings: the prompt moves the video instead of vanishing in the norms
        model.get_input_embeddings().weight.mul_(5.0)
    model.save_pretrained(str(folder))
