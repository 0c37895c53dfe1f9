"""A Qwen-Omni chat loop: the runtime's AR decode loop, plus audio and image parts run through the towers.

A prompt with media prefills with the placeholders' embeddings replaced by the towers' rows (`EMBEDS_AT`;
the towers run inside that step) at multimodal positions, and every later token sits at its index plus the
prompt's position offset (transformers' rope deltas). Shared by Qwen2.5-Omni and Qwen3-Omni.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from torch import nn

from vidloom.core.chat import ChatRequest
from vidloom.core.loop import Done, StepPlan
from vidloom.decoding.loop import ARDecodeLoop, DecodeState
from vidloom.layers.rotary import text_positions
from vidloom.models.omni_media import MediaPrompter, thinker_positions
from vidloom.models.omni_towers import towers_bytes
from vidloom.runtime.paged_decode import EMBEDS_AT


class MediaChatLoop(ARDecodeLoop):
    """ARDecodeLoop over the thinker with its media prompter."""

    def __init__(self, network: nn.Module, tokenizer: Any, prompter: MediaPrompter, eos_ids: Sequence[int]) -> None:
        super().__init__(network, tokenizer, lambda request: prompter.prompt(request.messages)[0], text_positions,
                         eos_ids)
        self.prompter = prompter

    def prepare(self, request: ChatRequest) -> tuple[list[int], Any]:
        return self.prompter.prompt(request.messages)

    def media_bytes(self, media: Any) -> int:
        """The towers' pass over the prompt's audio and images (vidloom.models.omni_towers.towers_bytes)."""
        param, towers = next(self.network.parameters()), self.prompter.encoders
        return towers_bytes(towers, self.prompter.processors, media, towers.row_width(self.network.config.hidden_size),
                            param.element_size(), param.device.type == "cpu")

    def next(self, state: DecodeState) -> StepPlan | Done:
        media = state.prompt.media
        plan = super().next(state)
        if media is None or isinstance(plan, Done):
            return plan
        inputs = {**plan.inputs, "positions": thinker_positions(media, state.cached, len(state.feed), state.device)}
        if state.cached == 0:
            dtype = next(self.network.parameters()).dtype
            inputs[EMBEDS_AT] = self.prompter.prefill_embeds(media, dtype, state.device)
        return dataclasses.replace(plan, inputs=inputs)
