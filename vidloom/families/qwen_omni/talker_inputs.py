"""What the talker reads: thinker states turned into its prefill and its per-step text stream.

Follows transformers' `Qwen2_5OmniForConditionalGeneration.generate` (5.24) step by step, because
the talker was trained on exactly this layout:
- prefill, one row per prompt token: thinker hidden state + thinker token embedding; then the voice's
  text-start token embedding; then the first reply token's state + embedding. (The talker's forward
  would also add the codec pad/start embeddings to the last two rows, but only when it receives an
  attention mask, and 5.24's generate() never passes it one; we follow the reference as it runs.)
- each decode step reads the codec embedding of the code it just chose plus the next row of the text
  stream: the remaining reply tokens' state + embedding, then the text-end embedding, then text-pad
  (repeated once the stream runs out).
- codes are chosen after a repetition penalty over every id the talker has seen (the mask/pad/start
  prompt ids and its own codes) with the codec start token suppressed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vidloom.families.qwen_omni.config import TalkerTokens
from vidloom.families.qwen_omni.decoder import OmniDecoder

DEFAULT_REPETITION_PENALTY = 1.05  # generate()'s talker_repetition_penalty default


@dataclass
class TalkerInputs:
    """The talker's prefill rows [P, embedding_size], its text stream [S, embedding_size] and its prompt ids."""

    prefill: Tensor
    stream: Tensor
    prompt_codes: list[int]


PREFILL_EXTRA_ROWS = 2  # talker prefill rows beyond the thinker prompt's: the voice's bos and the first reply row


def talker_inputs(thinker: OmniDecoder, talker: OmniDecoder, tokens: TalkerTokens, voice_bos: int,
                  prompt_ids: Tensor, fed_ids: Tensor, hidden: Tensor, media_at: Tensor | None = None) -> TalkerInputs:
    """Build the talker's inputs from one thinker sequence.

    prompt_ids [P]: the thinker prompt; fed_ids [R]: the reply tokens the thinker read after it (every
    reply token but the last one it chose, or a forced text); hidden [P + R, hidden]: the thinker's final
    normed states at those positions. R must be >= 1. `media_at`: prompt indices of audio/image placeholders,
    whose rows carry the hidden state alone (generate() zeroes their embeddings before the talker reads them).
    """
    embed = thinker.embed
    p = prompt_ids.shape[0]
    embeds = embed(torch.cat([prompt_ids, fed_ids]))
    if media_at is not None:
        embeds = embeds.index_fill(0, media_at, 0.0)
    rows = hidden + embeds  # [P + R, H]
    device = hidden.device

    def ids(*values: int) -> Tensor:
        return torch.tensor(values, device=device)

    prefill = torch.cat([rows[:p], embed(ids(voice_bos)), rows[p:p + 1]])
    stream = torch.cat([rows[p + 1:], embed(ids(tokens.text_end, tokens.text_pad))])
    prompt_codes = [tokens.codec_mask] * p + [tokens.codec_pad, tokens.codec_start]
    return TalkerInputs(prefill, stream, prompt_codes)


def step_input(talker: OmniDecoder, inputs: TalkerInputs, step: int, code: int) -> Tensor:
    """The talker's input row [1, embedding_size] for decode step `step` (1-based) after choosing `code`."""
    row = inputs.stream[min(step - 1, inputs.stream.shape[0] - 1)]
    return talker.embed(torch.tensor([code], device=row.device)) + row


def shape_logits(logits: Tensor, seen: set[int], tokens: TalkerTokens,
                 penalty: float = DEFAULT_REPETITION_PENALTY) -> Tensor:
    """Codec logits [vocab] after the repetition penalty over `seen` ids and with codec start suppressed."""
    logits = logits.float().clone()
    if penalty != 1.0 and seen:
        index = torch.tensor(sorted(seen), device=logits.device)
        picked = logits[index]
        logits[index] = torch.where(picked < 0, picked * penalty, picked / penalty)
    logits[tokens.codec_start] = float("-inf")
    return logits
