"""Qwen2.5-Omni's chat loop: the runtime's AR decode loop, plus audio and image parts run through the towers.

A prompt with media is one more step before the prefill (the towers, `media.ENCODE`); the prefill then
replaces the placeholders' embeddings with the towers' rows (`EMBEDS_AT`) at multimodal positions, and
every later token sits at its index plus the prompt's position offset (transformers' rope deltas).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from vidloom.core.chat import ChatRequest
from vidloom.core.loop import Done, LoopContext, StepPlan
from vidloom.decoding.loop import ARDecodeLoop, DecodeState
from vidloom.models.qwen_omni.decoder import OmniDecoder, text_positions
from vidloom.recipes.qwen_omni.media import MediaPrompter, thinker_positions
from vidloom.runtime.paged_decode import EMBEDS_AT


@dataclass
class OmniDecodeState(DecodeState):
    rows: Tensor | None = None  # the towers' output for the prompt's placeholders, once encoded


class OmniChatLoop(ARDecodeLoop):
    """ARDecodeLoop over the thinker with its media prompter."""

    def __init__(self, network: OmniDecoder, tokenizer: Any, prompter: MediaPrompter, eos_ids: Sequence[int]) -> None:
        super().__init__(network, tokenizer, lambda request: prompter.prompt(request.messages)[0], text_positions,
                         eos_ids)
        self.prompter = prompter

    def prepare(self, request: ChatRequest) -> tuple[list[int], Any]:
        return self.prompter.prompt(request.messages)

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> OmniDecodeState:
        state = super().init(slots, ctx)
        return OmniDecodeState(**{f.name: getattr(state, f.name) for f in dataclasses.fields(state)})

    def next(self, state: OmniDecodeState) -> StepPlan | Done:  # type: ignore[override]
        media = state.prompt.media
        plan = super().next(state)
        if media is None or isinstance(plan, Done):
            return plan
        if state.rows is None:
            return self.prompter.encode_plan(media, next(self.network.parameters()).dtype)
        inputs = {**plan.inputs, "positions": thinker_positions(media, state.cached, len(state.feed), state.device)}
        if state.cached == 0:
            inputs[EMBEDS_AT] = (media.at.to(state.device), state.rows)
        return dataclasses.replace(plan, inputs=inputs)

    def advance(self, state: OmniDecodeState, result: Any) -> OmniDecodeState:  # type: ignore[override]
        if state.prompt.media is not None and state.rows is None:
            state.rows = result
            return state
        return super().advance(state, result)  # type: ignore[return-value]
