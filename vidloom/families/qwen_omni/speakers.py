"""The checkpoint's speaker table (`spk_dict.pt`): per voice the talker's text-start token and token2wav's
speaker conditioning (an embedding and a reference mel), as the released Qwen2.5-Omni checkpoints ship it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from vidloom.core.errors import CheckpointError, InvalidRequest

SPEAKER_FILE = "spk_dict.pt"


@dataclass(frozen=True)
class Voice:
    name: str
    bos_token: int  # the thinker-vocabulary token that opens the talker's text stream for this voice
    cond: Tensor  # [1, enc_emb_dim] speaker embedding of the DiT
    ref_mel: Tensor  # [1, frames, mel_dim] reference mel the DiT's ECAPA encoder reads


def load_voices(folder: Path) -> dict[str, Voice]:
    """Every voice of `folder/spk_dict.pt` (CheckpointError naming the file when absent or malformed)."""
    path = Path(folder) / SPEAKER_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (the speaker table a Qwen2.5-Omni talker needs)")
    try:
        raw = torch.load(path, weights_only=True, map_location="cpu")
        voices = {str(name): Voice(str(name), int(entry["bos_token"]), entry["cond"].float(),
                                   entry["ref_mel"].float()) for name, entry in raw.items()}
    except (KeyError, TypeError, AttributeError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: not a speaker table of {{voice: {{bos_token, cond, ref_mel}}}} ({exc})") from None
    if not voices:
        raise CheckpointError(f"{path}: no voices")
    return voices


def pick_voice(voices: dict[str, Voice], name: str | None) -> Voice:
    """The named voice (the first one when None); InvalidRequest naming `voice` and the available ones."""
    if name is None:
        return next(iter(voices.values()))
    if name not in voices:
        raise InvalidRequest("voice", f"unknown voice {name!r}; available voices: {', '.join(sorted(voices))}")
    return voices[name]
