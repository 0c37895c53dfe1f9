"""Reason-then-generate: the model's own AR decode loop writes the detailed generation prompt first.

The "reason" loop wraps the card's ARDecodeLoop (the chat loop, same resident backbone): it asks
the runtime's cache manager for a K/V buffer sized for this one sequence, decodes greedily from
the reasoner prompt (a system instruction plus the user's prompt, through the checkpoint's chat
template) until EOS or `max_tokens`, one plan per token so the runtime sees every step (progress,
cancellation), and writes the text as the `reasoned_prompt` slot that generation then starts from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.chat import ChatMessage, ChatPart, ChatRequest, SamplingParams
from vidloom.core.loop import Done, LoopContext, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.decoding.loop import ARDecodeLoop, ChatPrompt, DecodeState
from vidloom.models.cosmos3.kv_buffer import BufferKV

REASON = "reason"
REASON_MAX_TOKENS = 256
"""Most tokens the reasoner may write for one request (its K/V buffer is sized for prompt + this)."""
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


@torch.no_grad()
def decode_step(plan: StepPlan, buffer: Tensor) -> Tensor:
    """Run one ar_decode plan of the reasoner's sequence on its buffer: the last token's logits [vocab]."""
    network, tokens = plan.call, plan.inputs["tokens"]
    kv = BufferKV(buffer, plan.inputs["start"], network.attention_scale)
    last = torch.tensor([tokens.shape[0] - 1], device=tokens.device)
    return network(tokens, plan.inputs["positions"], kv=kv, logits_at=last)[0]


@dataclass
class _OneSequence:
    """The DecodeContext of the reasoner's one sequence (its buffer is already sized for it)."""

    device: torch.device

    def reserve_kv(self, tokens: int) -> str:
        return REASON


@dataclass
class ReasonState:
    inner: DecodeState
    buffer: Tensor | None
    ctx: LoopContext


class ReasonLoop:
    """Greedy prompt writing over the card's ARDecodeLoop, with a per-request K/V buffer from the cache manager."""

    name = REASON

    def __init__(self, ar_loop: ARDecodeLoop, device: torch.device, dtype: torch.dtype,
                 max_tokens: int = REASON_MAX_TOKENS) -> None:
        self.ar_loop, self.device, self.dtype, self.max_tokens = ar_loop, device, dtype, max_tokens

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> ReasonState:
        request: GenerationRequest = slots["request"]
        chat = reasoner_request(request, self.max_tokens)
        ids = tuple(self.ar_loop.prompt(chat))
        config = self.ar_loop.network.config
        shape = (config.num_hidden_layers, 2, len(ids) + self.max_tokens, config.num_key_value_heads,
                 config.head_dim)
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=self.dtype).element_size()
        state = ReasonState(inner=None, buffer=None, ctx=ctx)  # type: ignore[arg-type]
        ctx.hold(lambda: setattr(state, "buffer", None))
        state.buffer = ctx.allocate(nbytes, lambda: torch.empty(shape, device=self.device, dtype=self.dtype))
        state.inner = self.ar_loop.init({"chat": ChatPrompt(chat, ids, self.max_tokens)}, _OneSequence(self.device))
        return state

    def next(self, state: ReasonState) -> StepPlan | Done:
        plan = self.ar_loop.next(state.inner)
        if isinstance(plan, Done):
            return plan
        return StepPlan(loop=REASON, index=plan.index, total=None, call=decode_step,
                        inputs={"plan": plan, "buffer": state.buffer})

    def advance(self, state: ReasonState, logits: Tensor) -> ReasonState:
        self.ar_loop.advance(state.inner, logits)
        deltas, state.inner.deltas = state.inner.deltas, []
        state.ctx.emit_text(REASON, "".join(d.text for d in deltas))  # streamed before denoising starts
        return state

    def finalize(self, state: ReasonState) -> dict[str, Any]:
        result = self.ar_loop.finalize(state.inner)["completion"]
        state.buffer = None
        return {"reasoned_prompt": result.text.strip(), "reasoned_ids": result.token_ids}
