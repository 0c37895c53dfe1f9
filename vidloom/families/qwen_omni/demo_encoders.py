"""qwen-omni-demo's audio and vision towers and its preprocessor_config.json, so audio and image parts run offline.

The towers are transformers' own Qwen2.5-Omni encoder modules (the architecture the loader builds for any
checkpoint) at a tiny size, their tensors written in the transformers layout (`thinker.audio_tower.*`,
`thinker.visual.*`) and filled from a seeded generator of ours, so the folder does not depend on how a
transformers version initialises them. The feature extractor and image processor settings are the released
ones at small sizes: 16 kHz Whisper log-mel features (fewer mel bins), Qwen2-VL 14-pixel patches merged 2x2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from torch import nn

from vidloom.loading.name_map import NameMap
from vidloom.models.omni_towers import seeded_tower_parts, write_processor_config

MEDIA_SPECIALS = ("<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>", "<|IMAGE|>", "<|vision_bos|>", "<|vision_eos|>",
                  "<|VIDEO|>")
MEL_BINS = 16  # the audio tower's num_mel_bins = the feature extractor's feature_size (the released: 128)
AUDIO_CHUNK_S = 30  # the feature extractor's chunk_length: the longest clip the demo reads, seconds
# The released audio tower's windows (n_window, max_source_positions); narrow and one layer deep.
AUDIO_CONFIG = dict(num_mel_bins=MEL_BINS, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
                    d_model=16, n_window=100, max_source_positions=1500)
VISION_CONFIG = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, fullatt_block_indexes=[0],
                     window_size=112, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
MAX_IMAGE_PIXELS = 224 * 224  # the image processor's max_pixels: at most 64 tokens per image
TOWER_GAIN = 8.0  # the towers' convolutions, in units of 1/sqrt(fan_in): loud enough that outputs follow inputs


def thinker_media_config(hidden_size: int, ids: Mapping[str, int]) -> dict[str, Any]:
    """The thinker_config entries for both towers and their placeholder tokens (ids: the tokenizer's)."""
    return {
        "audio_config": {**AUDIO_CONFIG, "output_dim": hidden_size},
        "vision_config": {**VISION_CONFIG, "out_hidden_size": hidden_size},
        "audio_token_index": ids["<|AUDIO|>"], "image_token_index": ids["<|IMAGE|>"],
        "video_token_index": ids["<|VIDEO|>"], "audio_start_token_id": ids["<|audio_bos|>"],
        "audio_end_token_id": ids["<|audio_eos|>"], "vision_start_token_id": ids["<|vision_bos|>"],
        "vision_end_token_id": ids["<|vision_eos|>"],
    }


def tower_parts(thinker_raw: Mapping[str, Any], seed: int) -> tuple[tuple[nn.Module, NameMap], ...]:
    """Both towers with seeded random weights, each with the name map that writes it under its checkpoint prefix."""
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as ref
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (Qwen2_5OmniAudioEncoderConfig,
                                                                             Qwen2_5OmniVisionEncoderConfig)

    audio = ref.Qwen2_5OmniAudioEncoder(Qwen2_5OmniAudioEncoderConfig(**thinker_raw["audio_config"]))
    vision = ref.Qwen2_5OmniVisionEncoder(Qwen2_5OmniVisionEncoderConfig(**thinker_raw["vision_config"]))
    return seeded_tower_parts(audio, vision, seed, TOWER_GAIN)


def write_processors(folder: Path) -> None:
    """preprocessor_config.json: the feature extractor's and image processor's settings, as the released file."""
    write_processor_config(folder, MEL_BINS, AUDIO_CHUNK_S, VISION_CONFIG["patch_size"], MAX_IMAGE_PIXELS,
                           "Qwen2_5OmniProcessor")
