"""Reason-then-generate: the model's own AR decode loop writes the detailed generation prompt first.

The "reason" loop is the card's ARDecodeLoop (the chat loop, same resident backbone) on a reasoner
prompt (a system instruction plus the user's prompt, through the checkpoint's chat template):
greedy, until EOS or `max_tokens`, its sequence's KV reserved from the runtime's one paged pool,
one paged decode step per token, so the runtime sees every step (progress, cancellation) and runs
it in the same forward as the running chats. It writes the text as the `reasoned_prompt` slot that
generation then starts from.
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import Tensor

from vidloom.core.chat import ChatMessage, ChatPart, ChatRequest, SamplingParams
from vidloom.core.loop import Done, LoopContext, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.decoding.loop import ARDecodeLoop, ChatPrompt, DecodeState

REASON = "reason"
REASON_MAX_TOKENS = 256
"""Most tokens the reasoner may write for one request (it reserves KV for prompt + this)."""
REASONER_SYSTEM = (
    "You are a prompt writer for an image and video generator. Rewrite the user's idea as one detailed "
    "generation prompt: the subjects, their appearance and actions, the setting, lighting, camera and motion. "
    "Answer with the prompt only."
)


def reasoner_request(request: GenerationRequest, max_tokens: int) -> ChatRequest:
    """The chat request the reasoner answers: greedy, bounded, on the user's prompt."""
    messages = (ChatMessage("system", (ChatPart("text", REASONER_SYSTEM),)),
                ChatMessage("user", (ChatPart("text", request.prompt),)))
    return ChatRequest(messages, SamplingParams(max_tokens=max_tokens, temperature=0.0),
                       request_id=f"reason-{request.request_id}")


class ReasonLoop:
    """Greedy prompt writing: the card's ARDecodeLoop on a sequence of the runtime's paged KV pool."""

    name = REASON

    def __init__(self, ar_loop: ARDecodeLoop, max_tokens: int = REASON_MAX_TOKENS) -> None:
        self.ar_loop, self.max_tokens = ar_loop, max_tokens

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> DecodeState:
        chat = reasoner_request(slots["request"], self.max_tokens)
        prompt = ChatPrompt(chat, tuple(self.ar_loop.prompt(chat)), self.max_tokens, phase=REASON)
        return self.ar_loop.init({"chat": prompt}, ctx)  # reserves prompt + max_tokens in the pool

    def next(self, state: DecodeState) -> StepPlan | Done:
        return self.ar_loop.next(state)

    def advance(self, state: DecodeState, logits: Tensor) -> DecodeState:
        return self.ar_loop.advance(state, logits)  # its text streams as TextEvents of phase "reason"

    def finalize(self, state: DecodeState) -> dict[str, Any]:
        return {"reasoned_prompt": self.ar_loop.finalize(state)["completion"].text.strip()}
