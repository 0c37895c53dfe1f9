"""Qwen2.5-Omni's audio and vision towers (transformers' Qwen2.5-Omni encoder modules; vidloom.models.omni_towers).

The towers' outputs are the embeddings the thinker reads at the audio / image placeholder tokens.
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

# The released template renders an audio part as <|audio_bos|><|AUDIO|><|audio_eos|>, an image as
# <|vision_bos|><|IMAGE|><|vision_eos|>.
MEDIA_TOKENS = MediaTokens(audio="<|AUDIO|>", image="<|IMAGE|>")


def audio_output_length(frames: int) -> int:
    """Tokens the audio tower makes from `frames` mel frames (two stride-2 stages: its conv and its pooling).

    transformers' `_get_feat_extract_output_lengths` (Qwen2.5-Omni processor and encoder)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


@dataclass(frozen=True)
class ThinkerEncoders(OmniTowers):
    """Qwen2.5-Omni's towers: rows as wide as the thinker's hidden size."""

    def audio_tokens(self, frames: int) -> int:
        return audio_output_length(frames)

    def encode(self, kind: str, inputs: Tensor, grid_thw: Tensor | None) -> Tensor:
        if kind == AUDIO:
            return encode_audio(self.audio, on_tower(self.audio, inputs))
        return encode_image(self.vision, on_tower(self.vision, inputs), on_tower(self.vision, grid_thw, False))


def load_encoders(folder: Path, thinker_raw: Mapping[str, Any], device: torch.device, dtype: torch.dtype,
                  stem: str, sdpa: SDPAScope = DEFAULT_SDPA) -> ThinkerEncoders:
    """The towers whose tensors the checkpoint holds, from `thinker_config`'s audio_config / vision_config."""
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as ref
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (Qwen2_5OmniAudioEncoderConfig,
                                                                             Qwen2_5OmniVisionEncoderConfig)

    folder = Path(folder)
    audio = vision = None
    if has_prefix(folder, AUDIO_PREFIX, stem):
        config = Qwen2_5OmniAudioEncoderConfig(**dict(thinker_raw.get("audio_config") or {}))
        audio = load_tower(folder, stem, AUDIO_PREFIX, ref.Qwen2_5OmniAudioEncoder, config, device, dtype)
    if has_prefix(folder, VISION_PREFIX, stem):
        config = Qwen2_5OmniVisionEncoderConfig(**dict(thinker_raw.get("vision_config") or {}))
        vision = load_tower(folder, stem, VISION_PREFIX, ref.Qwen2_5OmniVisionEncoder, config, device, dtype)
    merge = int((thinker_raw.get("vision_config") or {}).get("spatial_merge_size", 2))
    return ThinkerEncoders(audio, vision, merge, sdpa)


def encode_audio(tower: Any, features: Tensor) -> Tensor:
    """One clip's mel features [mel_bins, frames] (its valid frames only) -> embeddings [tokens, thinker hidden].

    Drives the tower as transformers' `Qwen2_5OmniThinkerModel.get_audio_features` does for one clip."""
    frames = torch.tensor([features.shape[1]], device=features.device)
    after_cnn = (frames - 1) // 2 + 1
    out = tower(features, feature_lens=frames, aftercnn_lens=after_cnn)
    return out.last_hidden_state


def encode_image(tower: Any, pixels: Tensor, grid_thw: Tensor) -> Tensor:
    """One image's patches [patches, C*T*P*P] and grid [1, 3] -> merged embeddings [tokens, thinker hidden]."""
    return tower(pixels, grid_thw=grid_thw).pooler_output
