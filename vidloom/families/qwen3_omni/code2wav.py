"""Codec frames -> waveform: transformers' `Qwen3OmniMoeCode2Wav`, loaded from the checkpoint, run in chunks.

The module is transformers' own (as the towers are): a sliding-window transformer over the frames' summed codebook
embeddings, a ConvNeXt upsampler and a SnakeBeta conv decoder, every layer causal; rebuilding it here would be a
second copy of ~500 lines with nothing to add. Chunking is generate()'s `chunked_decode`: each chunk is decoded
with up to `left_context` frames before it and only its own samples are kept, so a chunk's audio can leave as
soon as its frames exist (the talker streams it). Unlike chunked_decode, a window's short tail (its transposed
convs' trimmed overhang) is not lost at each chunk boundary but spoken with the next window: up to 300 frames the
whole equals the reference's waveform; past that, the reference drops those samples at each boundary and we do not.
Chunks differ from the whole only where `left_context` is shorter than the decoder's causal reach.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor, nn

from vidloom.loading.name_map import NameMap
from vidloom.loading.safetensors_io import load_weights

SAMPLE_RATE = 24000  # Qwen3-Omni speaks at 24 kHz (model card)
CHUNK_FRAMES = 300  # generate()'s chunked_decode(chunk_size=300, left_context_size=25)
LEFT_CONTEXT = 25
PREFIX = "code2wav"
_MODULE = "module"


def load_code2wav(folder: Path, raw: Mapping[str, Any], device: torch.device, dtype: torch.dtype,
                  stem: str) -> nn.Module:
    """transformers' Code2Wav from `code2wav_config`, its tensors from the checkpoint's `code2wav.*`."""
    from transformers.initialization import no_init_weights
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    config = Qwen3OmniMoeCode2WavConfig(**dict(raw.get("code2wav_config") or {}))
    with no_init_weights():  # derived buffers (rotary, code offsets) are made at construction: not on meta
        holder = nn.ModuleDict({_MODULE: Qwen3OmniMoeCode2Wav._from_config(config, dtype=dtype)})
    load_weights(holder, folder, NameMap(((PREFIX, _MODULE),)), stem=stem,
                 skip=lambda key: not key.startswith(PREFIX + "."))
    return holder[_MODULE].to(device).eval()


def samples_per_frame(code2wav: nn.Module) -> int:
    return int(code2wav.total_upsample)


def decode_chunk(code2wav: nn.Module, frames: Tensor, start: int, stop: int, left_context: int,
                 spoken: int) -> np.ndarray:
    """The samples after the first `spoken` that frames [:stop] of `frames` [N, groups] fix, decoded from frame
    `start` with up to `left_context` frames before it.

    Every layer is causal, and a window's output sample j is the whole utterance's sample at its own offset plus j
    (given enough left context): each transposed conv trims its kernel's overhang on both sides, so a window ends
    short of its frames' samples by the same overhang, and those samples come with the next window."""
    context = min(left_context, start)
    codes = frames[start - context:stop].T[None].to(next(code2wav.parameters()).device)
    with torch.inference_mode():
        wave = code2wav(codes)[0, 0]
    return wave[spoken - (start - context) * samples_per_frame(code2wav):].float().cpu().numpy()


@dataclass
class WaveChunks:
    """One utterance's chunked decode: frames [emitted, ...) are still to be spoken."""

    chunk_frames: int
    left_context: int = LEFT_CONTEXT
    emitted: int = 0  # frames decoded
    spoken: int = 0  # samples out
    pieces: list[np.ndarray] = field(default_factory=list)

    def ready(self, available: int, finished: bool) -> bool:
        """Whether a chunk can be decoded now: a full one has arrived, or no more frames will come."""
        return available > self.emitted and (finished or available - self.emitted >= self.chunk_frames)

    def stop(self, available: int) -> int:
        return min(available, self.emitted + self.chunk_frames)

    def count(self, frames: int) -> int:
        return math.ceil(frames / self.chunk_frames)

    def add(self, samples: np.ndarray, stop: int) -> None:
        self.pieces.append(samples)
        self.emitted, self.spoken = stop, self.spoken + len(samples)

    def audio(self) -> np.ndarray:
        return np.concatenate(self.pieces) if self.pieces else np.zeros(0, dtype=np.float32)
