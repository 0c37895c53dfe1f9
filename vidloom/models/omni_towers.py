"""A Qwen-Omni thinker's audio and vision towers: transformers' own encoder modules, used as components.

Shared by Qwen2.5-Omni and Qwen3-Omni. Each tower is built from the checkpoint's `thinker_config.audio_config` /
`vision_config` and loaded from its `thinker.audio_tower.*` / `thinker.visual.*` tensors through a name map, like
our own modules; a checkpoint without those tensors has no such tower (None) and its requests with that input are
refused. A family subclasses `OmniTowers` with how its towers count audio tokens and drive each tower.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vidloom.core.errors import CheckpointError
from vidloom.layers.attention import DEFAULT_SDPA, SDPAScope
from vidloom.loading.name_map import NameMap
from vidloom.loading.safetensors_io import load_weights, weight_files

AUDIO, IMAGE, VIDEO = "audio", "image", "video"
AUDIO_PREFIX = "thinker.audio_tower"
VISION_PREFIX = "thinker.visual"
PROCESSOR_FILE = "preprocessor_config.json"  # the released checkpoints' feature extractor + image processor settings
# The processors' float copies of one part (CPU): Whisper's STFT holds the framed clip, its windowed copy and the
# spectrum, float64 [frames, n_fft] each; the Qwen2-VL processor the decoded image as float arrays through resize,
# rescale and normalize, then its patches (a 560x560 image's processing measured ~3.8 patch-sized float32 copies
# of peak RSS on the tiny checkpoint; tests/integration/test_memory_estimates.py, "qwen-omni-chat-media").
AUDIO_PREP_COPIES = 3
IMAGE_PREP_COPIES = 4
SCORE_COPIES = 2  # attention scores and their softmax, [heads, rows, rows]
_TOWER = "tower"  # the holder's attribute: checkpoint prefix -> "tower.<rest>"


@dataclass(frozen=True)
class OmniTowers:
    """The towers a checkpoint has (None: it has no tensors for that one)."""

    audio: nn.Module | None
    vision: nn.Module | None
    merge_size: int = 2  # vision_config.spatial_merge_size: patches per merged token along each side
    sdpa: SDPAScope = DEFAULT_SDPA  # the SDPA kernels attention_backend allows the towers' attention

    @property
    def dtype(self) -> torch.dtype:
        tower = self.audio if self.audio is not None else self.vision
        return next(tower.parameters()).dtype if tower is not None else torch.float32

    def row_width(self, hidden: int) -> int:
        """The width of `encode`'s rows for a thinker of `hidden` size (its embeddings, and any more per token)."""
        return hidden

    def audio_tokens(self, frames: int) -> int:
        """Tokens the audio tower makes from `frames` mel frames."""
        raise NotImplementedError

    def encode(self, kind: str, inputs: Tensor, grid_thw: Tensor | None) -> Tensor:
        """One piece (audio: mel features [mel_bins, frames]; image: patches and grid [1, 3]) -> its rows [tokens, width]."""
        raise NotImplementedError


def on_tower(tower: nn.Module, tensor: Tensor, floating: bool = True) -> Tensor:
    """`tensor` on the tower's device (and in its dtype when `floating`)."""
    param = next(tower.parameters())
    return tensor.to(param.device, param.dtype) if floating else tensor.to(param.device)


def has_prefix(folder: Path, prefix: str, stem: str) -> bool:
    return any(key.startswith(prefix + ".") for key in weight_files(folder, stem))


def load_tower(folder: Path, stem: str, prefix: str, cls: Any, config: Any, device: torch.device,
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


def load_processors(folder: Path) -> tuple[Any, Any] | None:
    """The checkpoint's Whisper feature extractor and Qwen2-VL image processor (None without their file).

    The image processor alone: the released processors' video part needs torchvision, which we do not install."""
    if not (Path(folder) / PROCESSOR_FILE).is_file():
        return None
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    try:
        return (WhisperFeatureExtractor.from_pretrained(str(folder)),
                Qwen2VLImageProcessorPil.from_pretrained(str(folder)))
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{folder}/{PROCESSOR_FILE}: not a readable processor config ({exc})") from None


def write_processor_config(folder: Path, mel_bins: int, chunk_s: int, patch_size: int, max_pixels: int,
                           processor_class: str) -> None:
    """preprocessor_config.json as the released ones hold it: 16 kHz Whisper log-mel features of `mel_bins` bins
    over `chunk_s` seconds, Qwen2-VL patches of `patch_size` pixels merged 2x2 (a demo's or a test's folder)."""
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    features = WhisperFeatureExtractor(feature_size=mel_bins, sampling_rate=16000, hop_length=160,
                                       chunk_length=chunk_s, n_fft=400)
    side = 2 * patch_size  # the smallest image: one merged token
    images = Qwen2VLImageProcessorPil(min_pixels=side * side * 4, max_pixels=max_pixels, patch_size=patch_size,
                                      temporal_patch_size=2, merge_size=2)
    raw = {**features.to_dict(), **images.to_dict(), "processor_class": processor_class}
    raw.pop("mel_filters", None)  # derived from the settings
    (Path(folder) / PROCESSOR_FILE).write_text(json.dumps(raw, indent=2) + "\n")


def towers_bytes(encoders: OmniTowers, processors: Any, media: Any, width: int, act: int, on_cpu: bool) -> int:
    """The audio and vision towers' working set for a prompt's media (vidloom.models.omni_media.PromptMedia): the
    largest part's pass, every part's tower inputs and output rows [placeholders, width]; 0 for None (text).

    One part's pass is its tower's block (hidden, FFN) over its rows plus the attention scores and their softmax
    (float32, per head: a math kernel materialises them) over what one attention sees: an image's every patch
    (the released vision towers have full-attention blocks), a video's patches of one temporal step, an audio
    clip's window of 2 x n_window frames (transformers' audio towers attend within windows; their rows after the
    first stride-2 conv bound the rest). On CPU the processors' work (at admission, just before) shares the device's memory, and glibc keeps
    its freed blocks in its arenas: it is counted beside the pass (PREP_COPIES), not under it. An audio tower
    with a 2-d convolution front (Qwen3-Omni's, downsample_hidden_size channels) also holds its first
    convolution's output over every chunk and its activation during the pass."""
    from vidloom.core.footprint import block_bytes

    if media is None:
        return 0
    widest = held = 0
    for piece in media.pieces:
        if piece.kind == AUDIO:
            c = encoders.audio.config
            rows, size, ffn = piece.inputs.shape[1] // 2 + 1, c.d_model, c.encoder_ffn_dim
            heads = c.encoder_attention_heads
            seen = min(rows, 2 * int(c.n_window))
            prep = AUDIO_PREP_COPIES * piece.inputs.shape[1] * int(processors[0].n_fft) * 8
            front = _conv_bytes(c, piece, act)
        else:
            c = encoders.vision.config
            rows, size, ffn, heads = piece.inputs.shape[0], c.hidden_size, c.intermediate_size, c.num_heads
            seen = rows // int(piece.grid_thw[0, 0])  # one temporal step's patches (transformers' cu_seqlens)
            prep = IMAGE_PREP_COPIES * piece.inputs.numel() * 4
            front = 0
        scores = SCORE_COPIES * heads * rows * seen * 4
        widest = max(widest, block_bytes(1, rows, size, ffn, act) + scores + front + (prep if on_cpu else 0))
        held += piece.inputs.numel() * 4
    return widest + held + int(media.at.shape[0]) * width * act


def instance_towers_bytes(instance: Any, media: Any, act: int) -> int:
    """towers_bytes of a prompt's `media` on a loaded Qwen-Omni instance (its encoders, processors and thinker), as
    a chat answered aloud adds it to its speech estimate; 0 for None (text)."""
    if media is None:
        return 0
    encoders = instance["encoders"]
    return towers_bytes(encoders, instance.components.get("processors"), media,
                        encoders.row_width(instance["thinker"].config.hidden_size), act, instance.device.type == "cpu")


def seeded_tower_parts(audio: nn.Module, vision: nn.Module, seed: int,
                       gain: float) -> tuple[tuple[nn.Module, NameMap], ...]:
    """A demo's towers filled from a seeded generator of ours (so its folder does not depend on how a transformers
    version initialises them), each with the name map that writes it under its checkpoint prefix: matrices
    ~ 1/sqrt(fan_in), convolutions `gain` times louder (outputs follow inputs), norms near 1."""
    generator = torch.Generator().manual_seed(seed)
    parts = []
    for tower, prefix in ((audio, AUDIO_PREFIX), (vision, VISION_PREFIX)):
        with torch.no_grad():
            for name, p in sorted(tower.named_parameters()):
                noise = torch.randn(p.shape, generator=generator)
                if p.ndim >= 3:
                    p.copy_(gain * noise / p[0].numel() ** 0.5)
                elif p.ndim == 2:
                    p.copy_(noise / p.shape[1] ** 0.5)
                elif name.endswith("weight"):  # a norm's scale
                    p.copy_(1.0 + 0.1 * noise)
                else:
                    p.copy_(0.02 * noise)
        parts.append((nn.ModuleDict({_TOWER: tower.float()}), NameMap(((prefix, _TOWER),))))
    return tuple(parts)


def _conv_bytes(config: Any, piece: Any, act: int) -> int:
    """A 2-d convolution front's first output and its GELU, [chunks, channels, mel/2, n_window] each (transformers'
    Qwen3-Omni audio tower: chunks of 2 x n_window frames, stride 2); 0 for a tower without one (Qwen2.5-Omni)."""
    channels = int(getattr(config, "downsample_hidden_size", 0) or 0)
    window = 2 * int(config.n_window)
    chunks = -(-piece.inputs.shape[1] // window)
    return 2 * chunks * channels * (-(-piece.inputs.shape[0] // 2)) * (window // 2) * act
