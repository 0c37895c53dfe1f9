"""ARDecodeLoop: prefill, then one token per step, until EOS, a stop string or the token budget.

The loop owns decoding semantics (what to feed, how to pick the next token, when to stop); the
runtime owns the KV blocks (reserved from its one paged pool through `LoopContext.reserve_kv` at
`init`, released when the loop ends) and runs each planned step, batching the decode steps of every
running sequence (chats, a reasoner's) into one forward. The plan's total is open (None): a sequence
stops when it stops. Each step's new text and token reach the caller through `LoopContext.emit_text`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from vidloom.core.chat import ChatRequest, ChatResult
from vidloom.core.loop import DONE, KV_SEQUENCE, Done, LoopContext, StepPlan
from vidloom.decoding.detokenize import Detokenizer
from vidloom.decoding.sampling import make_generator, next_token

PromptFn = Callable[[ChatRequest], list[int]]
"""A chat request -> its prompt token ids (the model's chat template); InvalidRequest for what it cannot take."""
PositionsFn = Callable[[int, int, torch.device], Tensor]
"""(first position, token count, device) -> the model's position ids for that many text tokens."""
AR_DECODE = "ar_decode"


@dataclass(frozen=True)
class ChatPrompt:
    """The `chat` slot: a validated request, its prompt ids and its completion budget."""

    request: ChatRequest
    prompt_ids: tuple[int, ...]
    max_tokens: int
    phase: str = AR_DECODE  # what its streamed text reports as (TextEvent.phase): a reasoner's is "reason"
    media: Any = None  # a model's non-text prompt inputs (its loop's `prefill` reads them); None: text only


@dataclass
class DecodeState:
    """One sequence's decoding state (never on shared modules)."""

    prompt: ChatPrompt
    seq_id: str
    generator: torch.Generator | None
    detok: Detokenizer
    device: torch.device
    ctx: LoopContext
    cached: int = 0  # tokens whose K/V are in the cache
    feed: list[int] = field(default_factory=list)  # tokens the next forward reads
    completion: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    started: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None


class ARDecodeLoop:
    """The "ar_decode" loop of a causal LM: `network(ids, positions, kv=..., logits_at=...)` -> logits."""

    name = AR_DECODE

    def __init__(self, network: torch.nn.Module, tokenizer: Any, prompt: PromptFn, positions: PositionsFn,
                 eos_ids: Sequence[int]) -> None:
        self.network, self.tokenizer = network, tokenizer
        self.prompt, self.positions = prompt, positions
        self.eos_ids = frozenset(eos_ids)

    def prepare(self, request: ChatRequest) -> tuple[list[int], Any]:
        """The request's prompt ids and its non-text inputs (None here: a text model's prompt is its ids)."""
        return self.prompt(request), None

    def media_bytes(self, media: Any) -> int:
        """Working set of the encoders that turn `media` (what `prepare` returned) into prompt rows inside the
        prefill step, beyond the weights, for memory admission; a loop whose `prepare` returns media says."""
        raise NotImplementedError(f"{type(self).__name__} prepares media but does not estimate its encoders")

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> DecodeState:
        chat: ChatPrompt = slots["chat"]
        seq_id = ctx.reserve_kv(len(chat.prompt_ids) + chat.max_tokens)
        params = chat.request.sampling
        device = next(self.network.parameters()).device
        return DecodeState(chat, seq_id, make_generator(params), Detokenizer(self.tokenizer, params.stop),
                           device, ctx, feed=list(chat.prompt_ids))

    def next(self, state: DecodeState) -> StepPlan | Done:
        if state.finish_reason is not None:
            return DONE
        tokens = torch.tensor(state.feed, device=state.device)
        return StepPlan(
            loop=state.prompt.phase, index=len(state.completion), total=None, call=self.network,
            inputs={"tokens": tokens, "positions": self.positions(state.cached, len(state.feed), state.device),
                    KV_SEQUENCE: state.seq_id, "start": state.cached},
        )

    def advance(self, state: DecodeState, logits: Tensor) -> DecodeState:
        """Fold in the step's last-token logits [vocab]: pick the token, extend the text, check stops."""
        token = next_token(logits, state.prompt.request.sampling, state.generator)
        if state.first_token_s is None:
            state.first_token_s = time.perf_counter() - state.started
        state.cached += len(state.feed)
        state.feed = [token]
        state.completion.append(token)
        text = "" if token in self.eos_ids else state.detok.add(token)
        if token in self.eos_ids or state.detok.stopped:
            state.finish_reason = "stop"
        elif len(state.completion) >= state.prompt.max_tokens:
            state.finish_reason = "length"
        if state.finish_reason is not None:
            text += state.detok.flush()
        state.ctx.emit_text(state.prompt.phase, text, (token,))
        return state

    def finalize(self, state: DecodeState) -> dict[str, Any]:
        chat = state.prompt
        return {"completion": ChatResult(
            request_id=chat.request.request_id, text=state.detok.text, finish_reason=state.finish_reason or "cancelled",
            prompt_tokens=len(chat.prompt_ids), completion_tokens=len(state.completion),
            time_to_first_token_s=state.first_token_s or 0.0, token_ids=tuple(state.completion),
        )}
