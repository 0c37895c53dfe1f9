"""The thinker's audio and vision towers: transformers' own Qwen2.5-Omni encoder modules, used as components.

Built from the checkpoint's `thinker_config.audio_config` / `vision_config` and loaded from its
`thinker.audio_tower.*` / `thinker.visual.*` tensors through a name map, like our own modules. A
checkpoint without those tensors has no such tower (None): its requests with that input are refused.
The towers' outputs are the embeddings the thinker reads at the audio / image placeholder tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from vidloom.layers.attention import DEFAULT_SDPA, SDPAScope
from vidloom.loading.name_map import NameMap
from vidloom.loading.safetensors_io import load_weights, weight_files

AUDIO_PREFIX = "thinker.audio_tower"
VISION_PREFIX = "thinker.visual"
_TOWER = "tower"  # the holder's attribute: checkpoint prefix -> "tower.<rest>"


@dataclass(frozen=True)
class ThinkerEncoders:
    """The towers a checkpoint has (None: it has no tensors for that one)."""

    audio: nn.Module | None
    vision: nn.Module | None
    merge_size: int = 2  # vision_config.spatial_merge_size: patches per merged token along each side
    sdpa: SDPAScope = DEFAULT_SDPA  # the SDPA kernels attention_backend allows the towers' attention

    @property
    def dtype(self) -> torch.dtype:
        tower = self.audio if self.audio is not None else self.vision
        return next(tower.parameters()).dtype if tower is not None else torch.float32


def audio_output_length(frames: int) -> int:
    """Tokens the audio tower makes from `frames` mel frames (two stride-2 stages: its conv and its pooling).

    transformers' `_get_feat_extract_output_lengths` (Qwen2.5-Omni processor and encoder)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def _has_prefix(folder: Path, prefix: str, stem: str) -> bool:
    return any(key.startswith(prefix + ".") for key in weight_files(folder, stem))


def _load_tower(folder: Path, stem: str, prefix: str, cls: Any, config: Any, device: torch.device,
                dtype: torch.dtype) -> nn.Module:
    from transformers.initialization import no_init_weights

    # Built as transformers builds its towers (`_from_config`: the same attention implementation as the
    # reference picks), without random init: the checkpoint fills every tensor next. Their derived buffers
    # (sinusoid tables, rotary frequencies) are computed at construction, so the module is not built on meta.
    with no_init_weights():
        holder = nn.ModuleDict({_TOWER: cls._from_config(config, dtype=dtype)})
    load_weights(holder, folder, NameMap(((prefix, _TOWER),)), stem=stem,
                 skip=lambda key: not key.startswith(prefix + "."))
    return holder[_TOWER].to(device).eval()


def load_encoders(folder: Path, thinker_raw: Mapping[str, Any], device: torch.device, dtype: torch.dtype,
                  stem: str, sdpa: SDPAScope = DEFAULT_SDPA) -> ThinkerEncoders:
    """The towers whose tensors the checkpoint holds, from `thinker_config`'s audio_config / vision_config."""
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as ref
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (Qwen2_5OmniAudioEncoderConfig,
                                                                             Qwen2_5OmniVisionEncoderConfig)

    folder = Path(folder)
    audio = vision = None
    if _has_prefix(folder, AUDIO_PREFIX, stem):
        config = Qwen2_5OmniAudioEncoderConfig(**dict(thinker_raw.get("audio_config") or {}))
        audio = _load_tower(folder, stem, AUDIO_PREFIX, ref.Qwen2_5OmniAudioEncoder, config, device, dtype)
    if _has_prefix(folder, VISION_PREFIX, stem):
        config = Qwen2_5OmniVisionEncoderConfig(**dict(thinker_raw.get("vision_config") or {}))
        vision = _load_tower(folder, stem, VISION_PREFIX, ref.Qwen2_5OmniVisionEncoder, config, device, dtype)
    merge = int((thinker_raw.get("vision_config") or {}).get("spatial_merge_size", 2))
    return ThinkerEncoders(audio, vision, merge, sdpa)


def encode_audio(tower: nn.Module, features: Tensor) -> Tensor:
    """One clip's mel features [mel_bins, frames] (its valid frames only) -> embeddings [tokens, thinker hidden].

    Drives the tower as transformers' `Qwen2_5OmniThinkerModel.get_audio_features` does for one clip."""
    frames = torch.tensor([features.shape[1]], device=features.device)
    after_cnn = (frames - 1) // 2 + 1
    out = tower(features, feature_lens=frames, aftercnn_lens=after_cnn)
    return out.last_hidden_state


def encode_image(tower: nn.Module, pixels: Tensor, grid_thw: Tensor) -> Tensor:
    """One image's patches [patches, C*T*P*P] and grid [1, 3] -> merged embeddings [tokens, thinker hidden]."""
    return tower(pixels, grid_thw=grid_thw).pooler_output
