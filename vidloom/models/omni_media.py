"""A Qwen-Omni thinker's prompt with audio and image parts: placeholder tokens, tower inputs, multimodal positions.

Shared by Qwen2.5-Omni and Qwen3-Omni (they differ in placeholder names, `MediaTokens`, and in their towers,
`OmniTowers`). A chat's messages go through the checkpoint's chat template with each audio part as one audio
placeholder between its start/end tokens and each image as one image placeholder between the vision ones (the
released templates' rendering); each single placeholder is then widened to as many tokens as its tower
makes, as transformers' Qwen2_5OmniProcessor / Qwen3OmniMoeProcessor do. Audio features come from the checkpoint's Whisper
feature extractor, images from its Qwen2-VL image processor (both read from preprocessor_config.json).
A server prepares this on its media pool's threads; the towers run later, inside the thinker's prefill step,
on the device's thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from vidloom.core.chat import ChatMessage
from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.models.omni_towers import AUDIO, IMAGE, OmniTowers

TOWER_TENSORS = {AUDIO: "thinker.audio_tower.*", IMAGE: "thinker.visual.*"}
# transformers' Qwen2.5-Omni thinker config default: temporal positions per second of a vision grid step (still
# images have one grid step: their temporal positions do not depend on it).
POSITION_ID_PER_SECONDS = 25
# The longest side over the shortest an image may have: the Qwen2-VL image processor's smart_resize refuses a
# wider one (transformers' image_processing_qwen2_vl: "absolute aspect ratio must be smaller than 200").
MAX_IMAGE_ASPECT_RATIO = 200


@dataclass(frozen=True)
class MediaTokens:
    """A checkpoint's placeholder tokens: the single token each part widens into (its start token only names it)."""

    audio: str  # Qwen2.5-Omni <|AUDIO|>, Qwen3-Omni <|audio_pad|>
    image: str  # Qwen2.5-Omni <|IMAGE|>, Qwen3-Omni <|image_pad|>

    def of(self, kind: str) -> str:
        return self.audio if kind == AUDIO else self.image


@dataclass(frozen=True)
class MediaPiece:
    """One audio clip or image, ready for its tower, and the prompt positions of its placeholder tokens."""

    kind: str  # AUDIO | IMAGE
    inputs: Tensor  # audio: mel features [mel_bins, frames]; image: patches [patches, C*T*P*P]
    grid_thw: Tensor | None  # image: [1, 3]
    at: Tensor  # prompt indices of its placeholder tokens [tokens]


@dataclass(frozen=True)
class PromptMedia:
    """A prompt's non-text inputs: its pieces, its [3, P] multimodal positions and the offset text after it keeps."""

    pieces: tuple[MediaPiece, ...]
    positions: Tensor  # [3, P] (t, h, w) position ids of the prompt's tokens
    delta: int  # a token at index i >= P sits at position i + delta on every axis

    @property
    def at(self) -> Tensor:
        """Every placeholder's prompt index [K], in the order of `encode`'s rows."""
        return torch.cat([p.at for p in self.pieces])


def has_media(messages: Sequence[ChatMessage]) -> bool:
    return any(part.type != "text" for m in messages for part in m.content)


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages for the chat template: text-only ones as a string (as before), others as typed parts."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if all(p.type == "text" for p in m.content):
            out.append({"role": m.role, "content": m.text})
        else:
            out.append({"role": m.role, "content": [{"type": "text", "text": p.text} if p.type == "text"
                                                    else {"type": p.type} for p in m.content]})
    return out


def prepare_media(ids: list[int], messages: Sequence[ChatMessage], tokenizer: Any, processors: Any,
                  encoders: OmniTowers | None, merge_size: int, tokens: MediaTokens) -> tuple[list[int], PromptMedia]:
    """Widen the placeholders of the templated `ids` and prepare each part for its tower.

    InvalidRequest naming the part (messages[i].content[j]) when the checkpoint has no tower or processor for
    it, the audio is longer than the feature extractor's window, or the template did not render the part."""
    parts = [(f"messages[{i}].content[{j}]", part) for i, m in enumerate(messages)
             for j, part in enumerate(m.content) if part.type != "text"]
    token = {kind: tokenizer.convert_tokens_to_ids(tokens.of(kind)) for kind in (AUDIO, IMAGE)}
    prepared = [_prepare_part(where, part, processors, encoders, merge_size) for where, part in parts]
    found = [(i, kind) for i, t in enumerate(ids) for kind in (AUDIO, IMAGE) if t == token[kind]]
    if [kind for _, kind in found] != [part.type for _, part in parts]:
        raise InvalidRequest("messages", "the chat template did not render one placeholder per audio and image "
                                         f"part (or a text part holds a placeholder token such as {tokens.audio})")
    widened: list[int] = []
    pieces, start = [], 0
    for (index, kind), (inputs, grid, count) in zip(found, prepared):
        widened += ids[start:index]
        at = torch.arange(len(widened), len(widened) + count)
        widened += [token[kind]] * count
        pieces.append(MediaPiece(kind, inputs, grid, at))
        start = index + 1
    widened += ids[start:]
    positions, delta = multimodal_positions(len(widened), pieces, merge_size)
    return widened, PromptMedia(tuple(pieces), positions, delta)


def _prepare_part(where: str, part: Any, processors: Any, encoders: OmniTowers | None,
                  merge_size: int) -> tuple[Tensor, Tensor | None, int]:
    """(tower inputs, image grid or None, placeholder tokens) of one part."""
    tower = None if encoders is None else (encoders.audio if part.type == AUDIO else encoders.vision)
    if tower is None or processors is None:
        missing = TOWER_TENSORS[part.type] if tower is None else "preprocessor_config.json"
        raise InvalidRequest(where, f"{part.type} inputs need the thinker's {part.type} encoder, and this checkpoint "
                                    f"has none ({missing}); send text")
    if part.type == AUDIO:
        return _audio_features(where, part, processors[0], encoders)
    width, height = part.image.size
    if max(width, height) > MAX_IMAGE_ASPECT_RATIO * min(width, height):
        raise InvalidRequest(where, f"is a {width}x{height} image; its longer side may be at most "
                                    f"{MAX_IMAGE_ASPECT_RATIO} times its shorter (MAX_IMAGE_ASPECT_RATIO)")
    out = processors[1](images=[part.image], return_tensors="pt")
    grid = out["image_grid_thw"].long()
    return out["pixel_values"], grid, int(grid.prod()) // merge_size ** 2


def _audio_features(where: str, part: Any, extractor: Any, towers: OmniTowers) -> tuple[Tensor, None, int]:
    rate = int(extractor.sampling_rate)
    samples = np.asarray(part.audio, dtype=np.float32)
    if part.sample_rate != rate:
        raise InvalidRequest(where, f"audio at {part.sample_rate} Hz; this model reads {rate} Hz")
    window = float(extractor.chunk_length)
    if samples.shape[0] > window * rate:
        raise LimitExceeded(where, f"lasts {samples.shape[0] / rate:.3f} s, more than the {window:g} s the model's "
                                   "feature extractor reads (chunk_length in preprocessor_config.json)",
                            "chunk_length")
    # The processor pads every clip to chunk_length with zeros before the STFT; the valid frames only see
    # n_fft/2 samples past their centre, so padding by n_fft past the last hop gives the same frames.
    hop = int(extractor.hop_length)
    length = -(-samples.shape[0] // hop) * hop + int(extractor.n_fft)
    out = extractor(samples, sampling_rate=rate, padding="max_length", max_length=length,
                    return_attention_mask=True, return_tensors="pt")
    frames = int(out["attention_mask"][0].sum())
    if frames < 4:
        raise InvalidRequest(where, f"is too short ({samples.shape[0]} samples): the audio encoder needs at least "
                                    f"{4 * hop} samples")
    return out["input_features"][0, :, :frames], None, towers.audio_tokens(frames)


def multimodal_positions(length: int, pieces: Sequence[MediaPiece], merge_size: int) -> tuple[Tensor, int]:
    """(t, h, w) position ids [3, length] and the decode offset, as transformers' Qwen2.5-Omni `get_rope_index`.

    Text and audio tokens advance one position on every axis; an image's tokens share its first position in
    time and spread over rows (h) and columns (w) of its merged grid; whatever follows starts one past the
    largest position used. Follows the reference's layout step by step (the thinker was trained on it)."""
    positions = torch.empty(3, length, dtype=torch.long)
    images = {int(p.at[0]): p for p in pieces if p.kind == IMAGE}
    i, nxt = 0, 0
    while i < length:
        piece = images.get(i)
        if piece is None:
            positions[:, i] = nxt
            i, nxt = i + 1, nxt + 1
            continue
        t, h, w = (int(v) for v in piece.grid_thw[0])
        h, w = h // merge_size, w // merge_size
        tt = (torch.arange(t) * POSITION_ID_PER_SECONDS).view(-1, 1, 1).expand(t, h, w).flatten()
        hh = torch.arange(h).view(1, -1, 1).expand(t, h, w).flatten()
        ww = torch.arange(w).view(1, 1, -1).expand(t, h, w).flatten()
        block = torch.stack([tt, hh, ww]) + nxt
        positions[:, i:i + block.shape[1]] = block
        i, nxt = i + block.shape[1], int(block.max()) + 1
    return positions, nxt - length


def encode_media(encoders: OmniTowers, pieces: Sequence[MediaPiece], dtype: torch.dtype) -> Tensor:
    """Every piece through its tower: the rows [K, width] for the placeholders (PromptMedia.at), in order (width:
    the thinker's hidden size, or a multiple where the towers give more per token: OmniTowers.row_width)."""
    rows = []
    with torch.inference_mode(), encoders.sdpa():
        for piece in pieces:
            out = encoders.encode(piece.kind, piece.inputs, piece.grid_thw)
            if out.shape[0] != piece.at.shape[0]:
                raise RuntimeError(f"the {piece.kind} encoder made {out.shape[0]} rows for {piece.at.shape[0]} "
                                   "placeholder tokens")
            rows.append(out.to(dtype))
    return torch.cat(rows)


class MediaPrompter:
    """A checkpoint's template, processors and towers: chat messages -> (prompt ids, PromptMedia or None)."""

    def __init__(self, tokenizer: Any, processors: Any, encoders: OmniTowers | None, merge_size: int,
                 tokens: MediaTokens) -> None:
        self.tokenizer, self.processors, self.encoders, self.merge_size = tokenizer, processors, encoders, merge_size
        self.tokens = tokens

    def prompt(self, messages: Sequence[ChatMessage], system: str | None = None) -> tuple[list[int], PromptMedia | None]:
        """Token ids of `messages` (led by a `system` turn when given; errors still name the parts by their index
        in `messages`) and their media, prepared."""
        turns = template_messages(messages)
        if system is not None:
            turns.insert(0, {"role": "system", "content": system})
        ids = self.tokenizer.apply_chat_template(turns, tokenize=True, add_generation_prompt=True, return_dict=True)
        ids = list(ids["input_ids"])
        if not has_media(messages):
            return ids, None
        return prepare_media(ids, messages, self.tokenizer, self.processors, self.encoders, self.merge_size,
                             self.tokens)

    def prefill_embeds(self, media: PromptMedia, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Any]:
        """The prefill's EMBEDS_AT input: the placeholders' indices and the towers, run inside that step."""
        encoders = self.encoders
        assert encoders is not None
        return media.at.to(device), lambda: encode_media(encoders, media.pieces, dtype)


def thinker_positions(media: PromptMedia | None, cached: int, count: int, device: torch.device) -> Tensor:
    """Position ids [3, count] of the thinker's next `count` tokens after `cached` ones."""
    if media is None:
        return torch.arange(cached, cached + count, device=device).unsqueeze(0).expand(3, -1)
    if cached == 0:
        return media.positions.to(device)
    start = cached + media.delta
    return torch.arange(start, start + count, device=device).unsqueeze(0).expand(3, -1)
