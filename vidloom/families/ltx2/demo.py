"""ltx2-demo: the LTX-2 architecture at a tiny size with seeded random weights: video with its own sound.

The audio-video transformer, the text connectors, the video VAE (32x space, 8x time), the audio VAE and
the HiFi-GAN vocoder, a tiny Gemma3 text encoder built by transformers, and a latent upsampler in
latent_upsampler/ for the two-stage program (--two-stage). Written once into the user's cache as an
LTX2Pipeline folder with our own modules and loaded through the same loader as real checkpoints. Its
weights are random: the video and the sound are noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from vidloom.core.card import ModelCard
from vidloom.layers.attention import attention
from vidloom.loading.name_map import NameMap
from vidloom.loading.safetensors_io import save_weights
from vidloom.models.ltx2.audio_vae import LTX2_AUDIO_VAE_NAME_MAP, LTX2AudioVAE, LTX2AudioVAEConfig
from vidloom.models.ltx2.connectors import LTX2_CONNECTORS_NAME_MAP, LTX2ConnectorsConfig, LTX2TextConnectors
from vidloom.models.ltx2.transformer import LTX2_TRANSFORMER_NAME_MAP, LTX2Transformer, LTX2TransformerConfig
from vidloom.models.ltx2.upsampler import LTX2_UPSAMPLER_NAME_MAP, LTX2LatentUpsampler, LTX2LatentUpsamplerConfig
from vidloom.models.ltx2.video_vae import LTX2_VIDEO_VAE_NAME_MAP, LTX2VideoVAE, LTX2VideoVAEConfig
from vidloom.models.ltx2.vocoder import LTX2Vocoder, LTX2VocoderConfig
from vidloom.demo.cache import ensure_written, fill_zeros, noise_note, train_gemma_tokenizer, write_json
from vidloom.families.ltx2.cards import DEFAULTS, ltx2_card

DEMO_ID = "ltx2-demo"
DEMO_VERSION = 1  # bump when the demo's architecture or files change
DEMO_SEED = 20260106
DEMO_NOTE = noise_note(DEMO_ID, "LTX-2", "Lightricks/LTX-2")

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
DEMO_VAE = {
    "_class_name": "AutoencoderKLLTX2Video",
    "latent_channels": 8, "block_out_channels": [8, 16, 32, 32], "layers_per_block": [1, 1, 1, 1, 1],
    "decoder_block_out_channels": [16, 32, 64], "decoder_layers_per_block": [1, 1, 1, 1],
    "decoder_inject_noise": [False, False, False, False], "timestep_conditioning": False,
    "spatial_compression_ratio": 32, "temporal_compression_ratio": 8,
}
# LTX-2's audio layout (pixel norm, causal along time): 4 channels x 16 mel bins / 4 = the transformer's 16.
DEMO_AUDIO_VAE = {
    "_class_name": "AutoencoderKLLTX2Audio",
    "base_channels": 16, "output_channels": 2, "ch_mult": [1, 2], "num_res_blocks": 1, "latent_channels": 4,
    "norm_type": "pixel", "causality_axis": "height", "mel_bins": 16, "sample_rate": 16000,
    "mel_hop_length": 160, "resolution": 16,
}
# LTX-2.0's HiFi-GAN kind: 2 x 16 mel features in, 240 samples per mel frame (24 kHz from 100 frames/s).
DEMO_VOCODER = {
    "_class_name": "LTX2Vocoder",
    "in_channels": 32, "hidden_channels": 32, "out_channels": 2, "upsample_kernel_sizes": [12, 11, 16],
    "upsample_factors": [6, 5, 8], "resnet_kernel_sizes": [3, 5], "resnet_dilations": [[1, 3], [1, 2]],
    "act_fn": "leaky_relu", "leaky_relu_negative_slope": 0.1, "final_act_fn": "tanh", "output_sampling_rate": 24000,
}
DEMO_UPSAMPLER = {
    "_class_name": "LTX2LatentUpsamplerModel",
    "in_channels": 8, "mid_channels": 32, "num_blocks_per_stage": 1, "dims": 3, "spatial_upsample": True,
    "rational_spatial_scale": 2.0,
}
# Lightricks/LTX-2 scheduler/scheduler_config.json (the keys the pipeline reads).
DEMO_SCHEDULER = {
    "_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 1.0,
    "use_dynamic_shifting": True, "base_shift": 0.95, "max_shift": 2.05, "base_image_seq_len": 1024,
    "max_image_seq_len": 4096, "shift_terminal": 0.1,
}
MODEL_INDEX = {
    "_class_name": "LTX2Pipeline",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "vae": ["diffusers", "AutoencoderKLLTX2Video"],
    "audio_vae": ["diffusers", "AutoencoderKLLTX2Audio"],
    "text_encoder": ["transformers", "Gemma3ForConditionalGeneration"],
    "tokenizer": ["transformers", "GemmaTokenizerFast"],
    "connectors": ["ltx2", "LTX2TextConnectors"],
    "transformer": ["diffusers", "LTX2VideoTransformer3DModel"],
    "vocoder": ["ltx2", "LTX2Vocoder"],
}
# Four 32-pixel latent cells a side; the two-stage program (--two-stage) adds the upsampler's 2x pass.
DEMO_DEFAULTS = dataclasses.replace(DEFAULTS, height=128, width=128, num_frames=9, num_inference_steps=4)
SIZE_MULTIPLE, TEMPORAL_FACTOR = 32, 8


def demo_card() -> ModelCard:
    return ltx2_card(
        DEMO_ID, f"demo:{DEMO_ID}", multiple=SIZE_MULTIPLE, temporal=TEMPORAL_FACTOR, defaults=DEMO_DEFAULTS,
        description="LTX-2 video with sound (audio VAE + vocoder, two-stage upsampler) at a tiny size, random weights",
        notes=(DEMO_NOTE,), precision="float32",
    )


def ensure_demo_checkpoint(cache_dir: Path) -> Path:
    """The demo's folder in `cache_dir`, written first if absent."""
    return ensure_written(cache_dir, f"{DEMO_ID}-v{DEMO_VERSION}", write_demo_checkpoint)


def write_demo_checkpoint(folder: Path) -> None:
    """An LTX2Pipeline folder (plus latent_upsampler/) from our own modules."""
    torch.manual_seed(DEMO_SEED)
    _save(LTX2Transformer(LTX2TransformerConfig.from_diffusers(DEMO_TRANSFORMER), attention),
          folder / "transformer", LTX2_TRANSFORMER_NAME_MAP, DEMO_TRANSFORMER)
    _save(LTX2TextConnectors(LTX2ConnectorsConfig.from_diffusers(DEMO_CONNECTORS)),
          folder / "connectors", LTX2_CONNECTORS_NAME_MAP, DEMO_CONNECTORS)
    _save(LTX2VideoVAE(LTX2VideoVAEConfig.from_diffusers(DEMO_VAE)), folder / "vae", LTX2_VIDEO_VAE_NAME_MAP,
          DEMO_VAE)
    _save(LTX2AudioVAE(LTX2AudioVAEConfig.from_diffusers(DEMO_AUDIO_VAE)), folder / "audio_vae",
          LTX2_AUDIO_VAE_NAME_MAP, DEMO_AUDIO_VAE)
    vocoder = LTX2Vocoder(LTX2VocoderConfig.from_diffusers(DEMO_VOCODER))
    _save(vocoder, folder / "vocoder", vocoder.name_map, DEMO_VOCODER)
    upsampler = LTX2LatentUpsampler(LTX2LatentUpsamplerConfig.from_diffusers(DEMO_UPSAMPLER))
    # LTX2_UPSAMPLER_NAME_MAP renames the pixel-shuffle conv (diffusers' upsampler.0); the rational
    # resampler's conv has diffusers' own name already, so writing it back through that map would be wrong.
    name_map = NameMap(()) if upsampler.config.uses_rational_resampler else LTX2_UPSAMPLER_NAME_MAP
    _save(upsampler, folder / "latent_upsampler", name_map, DEMO_UPSAMPLER)

    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    _write_text_encoder(folder / "text_encoder", len(tokenizer) + 3)
    write_json(folder / "scheduler" / "scheduler_config.json", DEMO_SCHEDULER)
    write_json(folder / "model_index.json", MODEL_INDEX)


def _save(module: torch.nn.Module, folder: Path, name_map: Any, config: dict[str, Any]) -> None:
    fill_zeros(module)
    g = torch.Generator().manual_seed(DEMO_SEED + len(folder.name))
    with torch.no_grad():  # non-trivial latent statistics, so (de)normalisation is exercised as a real one is
        for name, buffer in module.named_buffers():
            if name == "latents_mean":
                buffer.copy_(0.3 * torch.randn(buffer.shape, generator=g))
            elif name == "latents_std":
                buffer.copy_(0.5 + torch.rand(buffer.shape, generator=g))
    save_weights(module, folder, name_map)
    write_json(folder / "config.json", config)


def _train_tokenizer() -> Any:
    return train_gemma_tokenizer(CORPUS, vocab_size=200, model_max_length=1024)


def _write_text_encoder(folder: Path, vocab: int) -> None:
    """A tiny Gemma3 (the LTX-2 text encoder's class); its image tokens sit past the tokenizer's vocabulary."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = dict(vocab_size=vocab, hidden_size=TEXT_HIDDEN, intermediate_size=2 * TEXT_HIDDEN,
                num_hidden_layers=TEXT_LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                max_position_embeddings=256, sliding_window=8, rope_theta=10000.0)
    vision = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                  patch_size=8)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          image_token_index=vocab - 1, boi_token_index=vocab - 2, eoi_token_index=vocab - 3)
    torch.manual_seed(DEMO_SEED + 1)
    model = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():  # loud embeddings: the prompt moves the video instead of vanishing in the norms
        model.get_input_embeddings().weight.mul_(5.0)
    model.save_pretrained(str(folder))
