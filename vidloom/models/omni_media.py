"""A Qwen-Omni thinker's prompt with audio, image and video parts: placeholder tokens, tower inputs, multimodal
positions.

Shared by Qwen2.5-Omni and Qwen3-Omni (they differ in placeholder names, `MediaTokens`, and in their towers,
`OmniTowers`). A chat's messages go through the checkpoint's chat template with each audio part as one audio
placeholder between its start/end tokens and each image (video) as one image (video) placeholder between the vision
ones (the released templates' rendering); each single placeholder is then widened to as many tokens as its tower
makes, as transformers' Qwen2_5OmniProcessor / Qwen3OmniMoeProcessor do; a video read with its sound track
(use_audio_in_video) widens to the track's start token, its frames' and its sound's tokens interleaved in time,
and the track's end token (Qwen3OmniMoeProcessor.replace_video_with_audio_token). Audio features come from the
checkpoint's Whisper feature extractor, images from its Qwen2-VL image processor (both read from
preprocessor_config.json), videos from our own sampling and patches (vidloom.models.omni_video).
A server prepares this on its media pool's threads; the towers run later, inside the thinker's prefill step,
on the device's thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from vidloom.core.chat import INPUT_AUDIO_RATE, ChatMessage
from vidloom.core.errors import InvalidRequest, LimitExceeded, counted
from vidloom.models.omni_towers import AUDIO, IMAGE, VIDEO, OmniTowers
from vidloom.models.omni_video import interleaved, video_inputs

TOWER_TENSORS = {AUDIO: "thinker.audio_tower.*", IMAGE: "thinker.visual.*", VIDEO: "thinker.visual.*"}
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
    video: str = ""  # Qwen3-Omni <|video_pad|>; "": the model takes no video parts
    audio_start: str = ""  # around a video's sound track read with it (Qwen3-Omni <|audio_start|>, <|audio_end|>)
    audio_end: str = ""

    def of(self, kind: str) -> str:
        return {AUDIO: self.audio, IMAGE: self.image, VIDEO: self.video}[kind]

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(kind for kind in (AUDIO, IMAGE, VIDEO) if self.of(kind))


@dataclass(frozen=True)
class MediaPiece:
    """One audio clip, image or video, ready for its tower, and the prompt positions of its placeholder tokens."""

    kind: str  # AUDIO | IMAGE | VIDEO
    inputs: Tensor  # audio: mel features [mel_bins, frames]; image, video: patches [patches, C*T*P*P]
    grid_thw: Tensor | None  # image, video: [1, 3]
    at: Tensor  # prompt indices of its placeholder tokens [tokens]
    second_per_grid: float = 1.0  # a video's seconds per temporal grid step (an image has one step)
    per_second: float = POSITION_ID_PER_SECONDS  # the thinker's time positions per second (position_id_per_seconds)
    audio_at: Tensor | None = None  # a video read with its sound track: the track's tokens' prompt indices


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


@dataclass(frozen=True)
class _Prepared:
    """One input of a part for its tower: its kind, inputs, grid, placeholder count and grid step in seconds."""

    kind: str
    inputs: Tensor
    grid: Tensor | None
    count: int
    second_per_grid: float = 1.0


def prepare_media(ids: list[int], messages: Sequence[ChatMessage], tokenizer: Any, processors: Any,
                  encoders: OmniTowers | None, merge_size: int, tokens: MediaTokens,
                  position_id_per_seconds: float = POSITION_ID_PER_SECONDS) -> tuple[list[int], PromptMedia]:
    """Widen the placeholders of the templated `ids` and prepare each part for its tower.

    InvalidRequest naming the part (messages[i].content[j]) when the model takes no such part, the checkpoint has
    no tower or processor for it, the audio is longer than the feature extractor's window, the video too short to
    sample, or the template did not render the part."""
    parts = [(f"messages[{i}].content[{j}]", part) for i, m in enumerate(messages)
             for j, part in enumerate(m.content) if part.type != "text"]
    for where, part in parts:
        if part.type not in tokens.kinds:
            raise InvalidRequest(where, f"this model takes no {part.type} parts")
    token = {kind: tokenizer.convert_tokens_to_ids(tokens.of(kind)) for kind in tokens.kinds}
    prepared = [_prepare_part(where, part, processors, encoders, merge_size) for where, part in parts]
    found = [(i, kind) for i, t in enumerate(ids) for kind in token if t == token[kind]]
    if [kind for _, kind in found] != [part.type for _, part in parts]:
        raise InvalidRequest("messages", "the chat template did not render one placeholder per audio, image and "
                                         f"video part (or a text part holds a placeholder token such as "
                                         f"{tokens.audio})")
    widened: list[int] = []
    pieces, start = [], 0
    for (index, kind), inputs in zip(found, prepared):
        widened += ids[start:index]
        pieces += _widen(widened, inputs, token, tokenizer, tokens, merge_size, position_id_per_seconds)
        start = index + 1
    widened += ids[start:]
    positions, delta = multimodal_positions(len(widened), pieces, merge_size)
    return widened, PromptMedia(tuple(pieces), positions, delta)


def _widen(widened: list[int], inputs: Sequence[_Prepared], token: dict[str, int], tokenizer: Any,
           tokens: MediaTokens, merge_size: int, per_second: float) -> list[MediaPiece]:
    """Append one part's placeholder tokens to `widened`; its pieces, at their prompt indices."""
    first = inputs[0]
    if len(inputs) == 1:
        at = torch.arange(len(widened), len(widened) + first.count)
        widened += [token[first.kind]] * first.count
        return [MediaPiece(first.kind, first.inputs, first.grid, at, first.second_per_grid, per_second)]
    sound = inputs[1]  # a video's sound track: [audio_start] frames and sound interleaved in time [audio_end]
    t, h, w = (int(v) for v in first.grid[0])
    # the processor times each frame token in float64 (numpy), get_rope_index in float32: each as its reference
    order = interleaved(torch.arange(t, dtype=torch.float64).repeat_interleave(h * w // merge_size ** 2)
                        * first.second_per_grid * per_second, sound.count)
    widened.append(tokenizer.convert_tokens_to_ids(tokens.audio_start))
    at = torch.arange(len(widened), len(widened) + len(order))
    is_video = torch.tensor(order)
    widened += [token[VIDEO] if v else token[AUDIO] for v in order]
    widened.append(tokenizer.convert_tokens_to_ids(tokens.audio_end))
    return [MediaPiece(VIDEO, first.inputs, first.grid, at[is_video], first.second_per_grid, per_second,
                       audio_at=at[~is_video]),
            MediaPiece(AUDIO, sound.inputs, None, at[~is_video])]


def _prepare_part(where: str, part: Any, processors: Any, encoders: OmniTowers | None,
                  merge_size: int) -> tuple[_Prepared, ...]:
    """One part's tower inputs (a video read with its sound track: the video's, then the track's)."""
    sound = part.type == VIDEO and part.video.audio is not None
    needs = ((AUDIO,) if part.type == AUDIO or sound else ()) + ((IMAGE,) if part.type != AUDIO else ())
    for kind in needs:
        tower = None if encoders is None else (encoders.audio if kind == AUDIO else encoders.vision)
        if tower is None or processors is None:
            missing = TOWER_TENSORS[kind] if tower is None else "preprocessor_config.json"
            what = "a video's sound track" if part.type == VIDEO and kind == AUDIO else f"{part.type} inputs"
            raise InvalidRequest(where, f"{what} need the thinker's {'audio' if kind == AUDIO else 'vision'} "
                                        f"encoder, and this checkpoint has none ({missing}); send text")
    if part.type == AUDIO:
        return (_audio_features(where, part.audio, part.sample_rate, processors[0], encoders),)
    if part.type == VIDEO:
        return _video(where, part.video, processors, encoders, merge_size)
    width, height = part.image.size
    _check_aspect(where, width, height, "image")
    out = processors[1](images=[part.image], return_tensors="pt")
    grid = out["image_grid_thw"].long()
    return (_Prepared(IMAGE, out["pixel_values"], grid, int(grid.prod()) // merge_size ** 2),)


def _video(where: str, video: Any, processors: Any, encoders: Any, merge_size: int) -> tuple[_Prepared, ...]:
    _check_aspect(where, *video.size, "video")
    sampled = video_inputs(video, processors[1])
    if sampled is None:
        raise InvalidRequest(where, f"has {counted(video.frame_count, 'frame')}; a video needs at least "
                                    f"{int(processors[1].temporal_patch_size)} (the vision tower's temporal patch)")
    count = int(sampled.grid_thw.prod()) // merge_size ** 2
    out = (_Prepared(VIDEO, sampled.patches, sampled.grid_thw, count, sampled.second_per_grid),)
    if video.audio is None:
        return out
    return out + (_audio_features(where, video.audio, INPUT_AUDIO_RATE, processors[0], encoders, "its sound track "),)


def _check_aspect(where: str, width: int, height: int, what: str) -> None:
    if max(width, height) > MAX_IMAGE_ASPECT_RATIO * min(width, height):
        raise InvalidRequest(where, f"is a {width}x{height} {what}; its longer side may be at most "
                                    f"{MAX_IMAGE_ASPECT_RATIO} times its shorter (MAX_IMAGE_ASPECT_RATIO)")


def _audio_features(where: str, samples: Any, sample_rate: int, extractor: Any, towers: OmniTowers,
                    subject: str = "") -> _Prepared:
    rate = int(extractor.sampling_rate)
    samples = np.asarray(samples, dtype=np.float32)
    if sample_rate != rate:
        raise InvalidRequest(where, f"audio at {sample_rate} Hz; this model reads {rate} Hz")
    window = float(extractor.chunk_length)
    if samples.shape[0] > window * rate:
        raise LimitExceeded(where, f"{subject}lasts {samples.shape[0] / rate:.3f} s, more than the {window:g} s the "
                                   "model's feature extractor reads (chunk_length in preprocessor_config.json)",
                            "chunk_length")
    # The processor pads every clip to chunk_length with zeros before the STFT; the valid frames only see
    # n_fft/2 samples past their centre, so padding by n_fft past the last hop gives the same frames.
    hop = int(extractor.hop_length)
    length = -(-samples.shape[0] // hop) * hop + int(extractor.n_fft)
    out = extractor(samples, sampling_rate=rate, padding="max_length", max_length=length,
                    return_attention_mask=True, return_tensors="pt")
    frames = int(out["attention_mask"][0].sum())
    if frames < 4:
        raise InvalidRequest(where, f"{subject}is too short ({samples.shape[0]} samples): the audio encoder needs "
                                    f"at least {4 * hop} samples")
    return _Prepared(AUDIO, out["input_features"][0, :, :frames], None, towers.audio_tokens(frames))


def vision_block(piece: MediaPiece, merge_size: int) -> Tensor:
    """An image's or video's (t, h, w) positions [3, tokens] from 0 (float32, as the reference computes them), in
    its tokens' order: second_per_grid * per_second apart per grid step, rows and columns of its merged grid."""
    t, h, w = (int(v) for v in piece.grid_thw[0])
    h, w = h // merge_size, w // merge_size
    times = torch.arange(t) * torch.tensor(piece.second_per_grid, dtype=torch.float32) * piece.per_second
    tt = times.view(-1, 1, 1).expand(t, h, w).flatten()
    hh = torch.arange(h, dtype=torch.float32).view(1, -1, 1).expand(t, h, w).flatten()
    ww = torch.arange(w, dtype=torch.float32).view(1, 1, -1).expand(t, h, w).flatten()
    return torch.stack([tt, hh, ww])


def multimodal_positions(length: int, pieces: Sequence[MediaPiece], merge_size: int) -> tuple[Tensor, int | float]:
    """(t, h, w) position ids [3, length] and the decode offset, as transformers' Qwen-Omni `get_rope_index`.

    Text and audio tokens advance one position on every axis; an image's or video's tokens spread over time,
    rows (h) and columns (w) of its merged grid from the next position; whatever follows starts one past the
    largest position used. A video read with its sound track places both from the same position (the track's
    tokens one apart) and what follows starts one past the largest position of the tokens after the other kind's
    last (the reference appends that tail last). Follows the reference's layout step by step, in float32 as it
    does (the thinker was trained on it); long positions unless a video's time step is fractional."""
    positions = torch.empty(3, length, dtype=torch.float32)
    spans = {_span_start(p): p for p in pieces if p.kind != AUDIO}
    i, nxt = 0, torch.tensor(0.0)
    while i < length:
        piece = spans.get(i)
        if piece is None:
            positions[:, i] = nxt
            i, nxt = i + 1, nxt + 1
            continue
        block = vision_block(piece, merge_size) + nxt
        if piece.audio_at is None:
            positions[:, i:i + block.shape[1]] = block
            i, nxt = i + block.shape[1], block.max() + 1
            continue
        positions[:, piece.at] = block
        positions[:, piece.audio_at] = torch.arange(piece.audio_at.shape[0]) + nxt
        last_video, last_audio = int(piece.at[-1]), int(piece.audio_at[-1])
        i = max(last_video, last_audio) + 1
        nxt = positions[:, min(last_video, last_audio) + 1:i].max() + 1
    if bool((positions == positions.round()).all()) and float(nxt) == round(float(nxt)):
        return positions.long(), int(nxt) - length
    return positions, float(nxt) - length


def _span_start(piece: MediaPiece) -> int:
    return int(piece.at[0]) if piece.audio_at is None else min(int(piece.at[0]), int(piece.audio_at[0]))


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
                 tokens: MediaTokens, position_id_per_seconds: float = POSITION_ID_PER_SECONDS) -> None:
        self.tokenizer, self.processors, self.encoders, self.merge_size = tokenizer, processors, encoders, merge_size
        self.tokens, self.position_id_per_seconds = tokens, position_id_per_seconds

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
                             self.tokens, self.position_id_per_seconds)

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
