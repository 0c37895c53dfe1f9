"""A thinker reply -> codec frames: the talker's inputs, then its decode loop with the code predictor.

Follows transformers 5.25 `Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True)`, because the talker
was trained on exactly this layout:
- prefill: every user turn's rows (a token's thinker embedding through text_projection; an audio or image
  placeholder's thinker state at accept_hidden_layer through hidden_projection), then the assistant turn's first 3
  tokens, 4 tts pads, tts bos and the first reply token (projected embeddings), plus on the assistant rows the codec
  embeddings of [0, 0, 0, nothink, think bos, think eos, voice, pad, bos];
- positions: the talker's own multimodal rope over those rows (its get_rope_index): text and audio rows advance one
  position on every axis, an image's rows spread over its merged grid (talker_config.spatial_merge_size), a video's
  over its grid and time (talker_config.position_id_per_seconds; with its sound track see talker_positions), and
  every later row, decode steps included, sits one past the largest position used;
- each step reads the sum of the last frame's code embeddings (the talker's for the first code, the predictor's
  per group for the others) plus the next text row: the remaining reply tokens, tts eos, then tts pad;
- a frame's first code is chosen after a repetition penalty over the talker's own codes, with the top 1024 ids
  but the end id suppressed; the predictor then chooses the frame's other codebooks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from vidloom.layers.rotary import text_positions
from vidloom.families.qwen3_omni.config import SpeechConfig
from vidloom.families.qwen3_omni.talker import EqualRowsCache, Pick, Talker
from vidloom.models.omni_media import MediaPiece, PromptMedia, multimodal_positions, vision_block
from vidloom.models.omni_towers import AUDIO, IMAGE, VIDEO
from vidloom.models.omni_video import interleaved

DEFAULT_REPETITION_PENALTY = 1.05  # generate()'s talker_repetition_penalty default
SUPPRESSED_TOP_IDS = 1024  # generate() suppresses the codec vocab's top 1024 ids (the special ones) but the end id
ASSISTANT_HEAD = 3  # <|im_start|> assistant \n: the rows before the reply's first token
TTS_PADS = 4


@dataclass
class TalkerInputs:
    """The talker's prefill rows [L, talker hidden], its text stream [S, hidden] and the tts pad row [hidden]; the
    prefill's position ids [3, L], and the offset of every later row (row i >= L sits at i + delta on every axis)."""

    prefill: Tensor
    stream: Tensor
    pad: Tensor
    positions: Tensor
    delta: int = 0

    def step_positions(self, start: int, count: int) -> Tensor:
        """Position ids [3, count] of `count` rows from row `start` (the prefill's, or decode rows after it)."""
        if start == 0:
            assert count == self.positions.shape[1]
            return self.positions
        return text_positions(start + self.delta, count, self.prefill.device)


def talker_inputs(talker: Talker, thinker_embed: Callable[[Tensor], Tensor], ids: Sequence[int], prompt_len: int,
                  tapped: Tensor, voice: int, eos_ids: Sequence[int], media: PromptMedia | None = None) -> TalkerInputs:
    """Inputs from one thinker sequence: `ids` the prompt and reply ([P + R], R >= 2), `tapped` [P + R - 1, thinker
    hidden] the thinker's states at accept_hidden_layer for the tokens it read (every id but the last), `media` the
    prompt's audio, image and video parts (None: text only)."""
    s: SpeechConfig = talker.speech
    device = tapped.device
    read = torch.tensor(list(ids[:-1]), device=device)
    embeds = thinker_embed(read)
    specials = talker.text_projection(thinker_embed(torch.tensor([s.tts_bos, s.tts_eos, s.tts_pad], device=device)))
    bos, eos, pad = specials.unbind(0)
    in_user = _user_turns(s, read)
    user = _user_rows(talker, s, read, embeds, tapped)[in_user]
    start = max(i for i in range(prompt_len - 1) if ids[i] == s.im_start and ids[i + 1] == s.assistant)
    text = talker.text_projection(embeds[start:])
    first = text[ASSISTANT_HEAD:ASSISTANT_HEAD + 1]
    head = torch.cat([text[:ASSISTANT_HEAD], pad.expand(TTS_PADS, -1), bos[None], first])
    codec = talker.decoder.embed(torch.tensor([s.codec_nothink, s.codec_think_bos, s.codec_think_eos, voice,
                                               s.codec_pad, s.codec_bos], device=device))
    head = head + torch.cat([torch.zeros_like(head[:ASSISTANT_HEAD]), codec])
    stream = torch.cat([text[ASSISTANT_HEAD + 1:], eos[None]])
    # Entry j holds reply token j + 1: the reply's first end token (or the end) becomes tts eos, anything after pad.
    reply = list(ids[prompt_len:])
    end = next((j for j, i in enumerate(reply) if i in eos_ids), len(reply))
    rows = torch.arange(stream.shape[0], device=device)[:, None]
    stream = torch.where(rows > end, pad, torch.where(rows == end, eos, stream))
    prefill = torch.cat([user, head])
    positions, delta = talker_positions(in_user, prefill.shape[0], media, s)
    return TalkerInputs(prefill, stream, pad, positions.to(device), delta)


def _user_turns(s: SpeechConfig, read: Tensor) -> Tensor:
    """Which of the `read` ids [N] are in a user turn (from its <|im_start|> to the next one) [N]."""
    n = read.shape[0]
    starts = torch.where(read == s.im_start, torch.arange(n, device=read.device), -1).cummax(0).values.clamp_min(0)
    return read[(starts + 1).clamp_max(n - 1)] == s.user


def _user_rows(talker: Talker, s: SpeechConfig, read: Tensor, embeds: Tensor, tapped: Tensor) -> Tensor:
    """Every read token's talker row: media placeholders through hidden_projection of their thinker state, the rest
    through text_projection of their embedding."""
    media = torch.isin(read, torch.tensor(s.media_ids, device=read.device))
    return torch.where(media[:, None], talker.hidden_projection(tapped), talker.text_projection(embeds))


def talker_positions(in_user: Tensor, rows: int, media: PromptMedia | None, s: SpeechConfig) -> tuple[Tensor, int]:
    """Position ids [3, rows] of the talker's prefill (the user turns' tokens, `in_user` [N] over the thinker's ids,
    then the assistant rows) and the offset of the rows after it, as transformers' talker get_rope_index places
    them: an image's rows on its merged grid, a video's over its grid and time (the talker's
    position_id_per_seconds), everything else one position per row.

    generate() never hands the talker use_audio_in_video, so its get_rope_index meets a video read with its sound
    track as an audio clip (the frames' and the sound's rows one position each, `_talker_video`) unless an image or
    a silent video is still to be placed, when it finds the video first and interleaves both in time."""
    if media is None:
        return text_positions(0, rows), 0
    row_of = in_user.long().cumsum(0).cpu() - 1  # a user token's talker row
    images = sum(p.kind == IMAGE for p in media.pieces)
    videos = sum(p.kind == VIDEO and p.audio_at is None for p in media.pieces)
    placed = []
    for piece in media.pieces:
        if piece.kind == AUDIO:
            continue
        if piece.audio_at is not None and images <= 0 and videos <= 0:
            continue  # its rows one position each, as text
        images -= piece.kind == IMAGE
        videos -= piece.kind == VIDEO
        placed.append(_talker_piece(piece, row_of, s))
    return multimodal_positions(rows, placed, s.spatial_merge_size)


def _talker_piece(piece: MediaPiece, row_of: Tensor, s: SpeechConfig) -> MediaPiece:
    """`piece` at its talker rows, timed by the talker's position_id_per_seconds; a video's sound track
    re-interleaved by those times (the thinker's own may differ)."""
    piece = dataclasses.replace(piece, at=row_of[piece.at], per_second=s.position_id_per_seconds)
    if piece.audio_at is None:
        return piece
    rows = torch.cat([piece.at, row_of[piece.audio_at]]).sort().values
    times = vision_block(piece, s.spatial_merge_size)[0]
    is_video = torch.tensor(interleaved(times, rows.shape[0] - piece.at.shape[0]))
    return dataclasses.replace(piece, at=rows[is_video], audio_at=rows[~is_video])


def shape_logits(logits: Tensor, seen: Sequence[int], s: SpeechConfig,
                 penalty: float = DEFAULT_REPETITION_PENALTY) -> Tensor:
    """Codec logits [vocab] after the repetition penalty over `seen` codes and the special ids' suppression."""
    logits = logits.float().clone()
    if penalty != 1.0 and seen:
        index = torch.tensor(sorted(set(seen)), device=logits.device)
        picked = logits[index]
        logits[index] = torch.where(picked < 0, picked * penalty, picked / penalty)
    vocab = logits.shape[-1]
    keep = logits[s.codec_eos].clone()
    logits[max(0, vocab - SUPPRESSED_TOP_IDS):] = float("-inf")
    logits[s.codec_eos] = keep
    return logits


def next_frames(talker: Talker, inputs: Sequence[TalkerInputs], steps: Sequence[int], codes: Sequence[int],
                states: Tensor, pick_rest: Pick) -> tuple[Tensor, Tensor]:
    """After the talker chose `codes[b]` at `steps[b]` (0-based) from its last state `states[b]` ([B, hidden]), for
    B sequences at once: their frames' codes [B, G] (one predictor forward chooses the rest) and the talker's next
    input rows [B, hidden]."""
    first_ids = torch.tensor(list(codes), device=states.device)
    first = talker.decoder.embed(first_ids)
    rest, rest_sum = talker.predictor(states, first, pick_rest)
    text = torch.stack([x.stream[step] if step < x.stream.shape[0] else x.pad for x, step in zip(inputs, steps)])
    return torch.cat([first_ids[:, None], rest.to(first_ids.device)], 1), first + rest_sum + text


def generate_frames(talker: Talker, inputs: TalkerInputs, pick_first: Callable[[Tensor], int], pick_rest: Pick,
                    max_frames: int, penalty: float = DEFAULT_REPETITION_PENALTY) -> Tensor:
    """Codec frames [N, code_groups] (N <= max_frames) until the talker's end id; one sequence, its own KV (the
    runtime's loop, talker_loop.py, steps the same on the paged pool)."""
    decoder, s = talker.decoder, talker.speech
    kv = EqualRowsCache(1, decoder.attention_scale)
    length = inputs.prefill.shape[0]
    logits, hidden = decoder(None, inputs.step_positions(0, length), kv=kv,
                             logits_at=torch.tensor([length - 1]), return_hidden=True, inputs_embeds=inputs.prefill)
    frames: list[Tensor] = []
    for step in range(max_frames + 1):
        code = pick_first(shape_logits(logits[0], [int(f[0]) for f in frames], s, penalty))
        if code == s.codec_eos or step == max_frames:
            break
        frame, row = next_frames(talker, [inputs], [step], [code], hidden[-1:], pick_rest)
        frames.append(frame[0])
        logits, hidden = decoder(None, inputs.step_positions(length + step, 1), kv=kv, return_hidden=True,
                                 inputs_embeds=row)
    if not frames:
        return torch.zeros(0, s.code_groups, dtype=torch.long)
    return torch.stack(frames)


def greedy(logits: Tensor) -> Tensor:
    """The argmax over the last axis (a Pick's and pick_first's greedy choice)."""
    return logits.argmax(-1)
