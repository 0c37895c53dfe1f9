"""Qwen3-Omni's audio and vision towers (transformers' Qwen3-Omni encoder modules; vidloom.models.omni_towers).

The vision tower also gives deepstack features: one merged row per image token for each of its
deepstack_visual_indexes layers, which the thinker adds to its hidden states after its first blocks
(transformers' `Qwen3OmniMoeThinkerTextModel._deepstack_process`). A piece's rows carry them beside its
embeddings, [tokens, hidden * (1 + deepstack)]; an audio clip's deepstack part is zeros (adding it is exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.layers.attention import DEFAULT_SDPA, SDPAScope
from vidloom.models.omni_media import MediaTokens
from vidloom.models.omni_towers import (AUDIO, AUDIO_PREFIX, VISION_PREFIX, OmniTowers, has_prefix, load_tower,
                                        on_tower)

# The released template renders an audio part as <|audio_start|><|audio_pad|><|audio_end|>, an image as
# <|vision_start|><|image_pad|><|vision_end|>, a video as <|vision_start|><|video_pad|><|vision_end|>; a video's
# sound track read with it sits between <|audio_start|> and <|audio_end|> inside the vision ones.
MEDIA_TOKENS = MediaTokens(audio="<|audio_pad|>", image="<|image_pad|>", video="<|video_pad|>",
                           audio_start="<|audio_start|>", audio_end="<|audio_end|>")
POSITION_ID_PER_SECONDS = 25  # transformers' Qwen3OmniMoeThinkerConfig default (the released configs say 13)
AUDIO_WINDOW = 50  # transformers' Qwen3OmniMoeAudioEncoderConfig default n_window (half a chunk, in mel frames)
FRAMES_PER_CHUNK_TOKENS = 13  # tokens one full chunk of 2 * n_window frames makes (transformers' constant)


def audio_output_length(frames: int, n_window: int = AUDIO_WINDOW) -> int:
    """Tokens the audio tower makes from `frames` mel frames: chunks of 2 * n_window frames, each through three
    stride-2 convolutions. transformers' `_get_feat_extract_output_lengths` (Qwen3-Omni processor and encoder)."""
    chunk = 2 * n_window
    tail = (frames % chunk - 1) // 2 + 1
    return ((tail - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * FRAMES_PER_CHUNK_TOKENS


@dataclass(frozen=True)
class Qwen3Towers(OmniTowers):
    """Qwen3-Omni's towers: rows [tokens, hidden * (1 + deepstack)]; a video's patches go through the vision tower
    as an image's do (its grid has more than one time step)."""

    hidden: int = 0  # the thinker's hidden size (the towers' output width)
    deepstack: int = 0  # vision_config.deepstack_visual_indexes: the thinker blocks whose outputs get features
    n_window: int = AUDIO_WINDOW
    position_id_per_seconds: float = POSITION_ID_PER_SECONDS  # thinker_config: time positions per video second

    def row_width(self, hidden: int) -> int:
        return hidden * (1 + self.deepstack)

    def audio_tokens(self, frames: int) -> int:
        return audio_output_length(frames, self.n_window)

    def encode(self, kind: str, inputs: Tensor, grid_thw: Tensor | None) -> Tensor:
        if kind == AUDIO:
            features = on_tower(self.audio, inputs)
            frames = torch.tensor([features.shape[1]], device=features.device)
            rows = self.audio(features, feature_lens=frames).last_hidden_state
            return torch.cat([rows, rows.new_zeros(rows.shape[0], self.hidden * self.deepstack)], dim=-1)
        out = self.vision(on_tower(self.vision, inputs), grid_thw=on_tower(self.vision, grid_thw, False))
        return torch.cat([out.pooler_output, *out.deepstack_features], dim=-1)


def load_encoders(folder: Path, thinker_raw: Mapping[str, Any], device: torch.device, dtype: torch.dtype,
                  stem: str, sdpa: SDPAScope = DEFAULT_SDPA) -> Qwen3Towers:
    """The towers whose tensors the checkpoint holds, from `thinker_config`'s audio_config / vision_config."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as ref
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (Qwen3OmniMoeAudioEncoderConfig,
                                                                                 Qwen3OmniMoeVisionEncoderConfig)

    folder = Path(folder)
    audio_config = Qwen3OmniMoeAudioEncoderConfig(**dict(thinker_raw.get("audio_config") or {}))
    vision_config = Qwen3OmniMoeVisionEncoderConfig(**dict(thinker_raw.get("vision_config") or {}))
    audio = vision = None
    if has_prefix(folder, AUDIO_PREFIX, stem):
        audio = load_tower(folder, stem, AUDIO_PREFIX, ref.Qwen3OmniMoeAudioEncoder, audio_config, device, dtype)
    if has_prefix(folder, VISION_PREFIX, stem):
        vision = load_tower(folder, stem, VISION_PREFIX, ref.Qwen3OmniMoeVisionEncoder, vision_config, device,
                            dtype)
    return Qwen3Towers(audio, vision, int(vision_config.spatial_merge_size), sdpa,
                       hidden=int(vision_config.out_hidden_size),
                       deepstack=len(vision_config.deepstack_visual_indexes) if vision is not None else 0,
                       n_window=int(audio_config.n_window),
                       position_id_per_seconds=thinker_raw.get("position_id_per_seconds", POSITION_ID_PER_SECONDS))
