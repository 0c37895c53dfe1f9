"""The thinker stage of speech: the reply's tokens and the final hidden states the talker reads.

A sequence of the runtime's paged KV pool (reserved at init, returned when the loop ends), stepped
as paged decode plans that also ask for hidden states (`WANT_HIDDEN`), so its steps share the decode
forward with running chats. Forced text (speak this) is one prefill of prompt + text; a generated
reply decodes token by token until the end token or its budget, streaming its text as it goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.loop import DONE, KV_SEQUENCE, Done, LoopContext, StepPlan
from vidloom.core.speech import SpeechRequest
from vidloom.decoding.spoken_reply import ReplyState, advance_reply, start_reply
from vidloom.families.qwen_omni.decoder import OmniDecoder
from vidloom.families.qwen_omni.speakers import Voice
from vidloom.models.omni_media import MediaPrompter, PromptMedia, thinker_positions
from vidloom.runtime.paged_decode import EMBEDS_AT, WANT_HIDDEN

THINKER = "thinker"
TRANSCRIPT_PHASE = "transcript"  # TextEvent phase of the spoken reply's text


@dataclass(frozen=True)
class SpeechPrompt:
    """The `speech` slot: a validated request, its voice, prompt ids, forced reply ids (or None) and budgets."""

    request: SpeechRequest
    voice: Voice
    prompt_ids: tuple[int, ...]
    forced_ids: tuple[int, ...] | None
    max_tokens: int  # reply tokens at most (forced: the text's)
    media: PromptMedia | None = None  # the prompt's audio and image parts (a chat's), None: text only


@dataclass(frozen=True)
class ThinkerOutput:
    """What the talker reads: prompt ids, the reply tokens fed back, their hidden states, and the reply text."""

    prompt_ids: Tensor  # [P]
    fed_ids: Tensor  # [R]
    hidden: Tensor  # [P + R, hidden]
    reply_ids: tuple[int, ...]
    text: str
    media_at: Tensor | None = None  # prompt indices of audio/image placeholders (their token embedding is not read)


ThinkerState = ReplyState


class ThinkerLoop:
    """Greedy or sampled reply (chat sampling params), or a forced one, on the paged pool."""

    name = THINKER

    def __init__(self, network: OmniDecoder, tokenizer: Any, eos_ids: tuple[int, ...],
                 prompter: MediaPrompter | None = None) -> None:
        self.network, self.tokenizer, self.eos_ids = network, tokenizer, frozenset(eos_ids)
        self.prompter = prompter

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> ThinkerState:
        prompt: SpeechPrompt = slots["speech"]
        feed = list(prompt.prompt_ids) + list(prompt.forced_ids or ())
        return start_reply(self.network, self.tokenizer, prompt, ctx, feed)

    def next(self, state: ThinkerState) -> StepPlan | Done:
        if state.done:
            return DONE
        media = state.prompt.media
        inputs = {"tokens": torch.tensor(state.feed, device=state.device),
                  "positions": thinker_positions(media, state.cached, len(state.feed), state.device),
                  KV_SEQUENCE: state.seq_id, "start": state.cached, WANT_HIDDEN: True}
        if media is not None and state.cached == 0:  # the towers run inside the prefill step
            assert self.prompter is not None
            inputs[EMBEDS_AT] = self.prompter.prefill_embeds(media, next(self.network.parameters()).dtype,
                                                             state.device)
        return StepPlan(loop=THINKER, index=len(state.reply), total=None, call=self.network, inputs=inputs)

    def advance(self, state: ThinkerState, result: tuple[Tensor, Tensor]) -> ThinkerState:
        advance_reply(state, result, self.eos_ids, TRANSCRIPT_PHASE)
        return state

    def finalize(self, state: ThinkerState) -> dict[str, Any]:
        prompt = torch.tensor(state.prompt.prompt_ids, device=state.device)
        forced = state.prompt.forced_ids
        # The talker reads the states of the tokens the thinker read: every forced token, or every chosen
        # token but the last (never fed back).
        fed = list(forced) if forced is not None else state.reply[:-1]
        hidden = torch.cat(state.hidden)[: len(prompt) + len(fed)]
        text = state.prompt.request.text if forced is not None else state.detok.text
        media = state.prompt.media
        return {"thinker": ThinkerOutput(prompt, torch.tensor(fed, dtype=torch.long, device=state.device), hidden,
                                         tuple(state.reply), text or "",
                                         None if media is None else media.at.to(state.device))}
