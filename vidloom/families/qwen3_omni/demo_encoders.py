"""qwen3-omni-demo's audio and vision towers and its preprocessor_config.json, so audio and image parts run offline.

The towers are transformers' own Qwen3-Omni encoder modules (what the loader builds for any checkpoint) at a tiny
size, one deepstack layer included, filled from a seeded generator of ours (vidloom.models.omni_towers). The
feature extractor and image processor settings are the released ones at small sizes: 16 kHz Whisper log-mel
features (fewer mel bins), Qwen2-VL 16-pixel patches merged 2x2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from torch import nn

from vidloom.loading.name_map import NameMap
from vidloom.models.omni_towers import seeded_tower_parts, write_processor_config

MEL_BINS = 16  # the audio tower's num_mel_bins = the feature extractor's feature_size (the released: 128)
AUDIO_CHUNK_S = 30  # the feature extractor's chunk_length: the longest clip the demo reads, seconds
# The released towers' windows and patches (n_window, patch_size, merge size), narrow and one layer deep; the
# vision tower's one block also feeds the thinker's first block (deepstack_visual_indexes).
AUDIO_CONFIG = dict(num_mel_bins=MEL_BINS, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
                    d_model=16, downsample_hidden_size=16, n_window=50, n_window_infer=800)
VISION_CONFIG = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=16, spatial_merge_size=2,
                     temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0])
MAX_IMAGE_PIXELS = 256 * 256  # the image processor's max_pixels: at most 64 tokens per image
TOWER_GAIN = 8.0  # the towers' convolutions, in units of 1/sqrt(fan_in): loud enough that outputs follow inputs


# thinker_config's placeholder keys -> the released tokenizer's tokens.
TOKEN_KEYS = {"audio_token_id": "<|audio_pad|>", "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
              "audio_start_token_id": "<|audio_start|>", "audio_end_token_id": "<|audio_end|>",
              "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}


def thinker_media_config(hidden_size: int, ids: Mapping[str, int]) -> dict[str, Any]:
    """The thinker_config entries for both towers (their outputs as wide as the thinker) and their placeholder
    tokens (ids: the tokenizer's)."""
    towers = {"audio_config": {**AUDIO_CONFIG, "output_dim": hidden_size},
              "vision_config": {**VISION_CONFIG, "out_hidden_size": hidden_size}}
    return {**towers, **{key: ids[token] for key, token in TOKEN_KEYS.items()}}


def tower_parts(thinker_raw: Mapping[str, Any], seed: int) -> tuple[tuple[nn.Module, NameMap], ...]:
    """Both towers (transformers' modules, as the loader builds them) with seeded random weights, each with the
    name map that writes it under its checkpoint prefix."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as ref
    from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as configs

    return seeded_tower_parts(
        ref.Qwen3OmniMoeAudioEncoder(configs.Qwen3OmniMoeAudioEncoderConfig(**thinker_raw["audio_config"])),
        ref.Qwen3OmniMoeVisionEncoder(configs.Qwen3OmniMoeVisionEncoderConfig(**thinker_raw["vision_config"])),
        seed, TOWER_GAIN)


def write_processors(folder: Path) -> None:
    """preprocessor_config.json: the feature extractor's and image processor's settings, as the released file."""
    write_processor_config(folder, MEL_BINS, AUDIO_CHUNK_S, VISION_CONFIG["patch_size"], MAX_IMAGE_PIXELS,
                           "Qwen3OmniMoeProcessor")
