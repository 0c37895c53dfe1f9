"""The reply a speech model's thinker writes, or is given, one step at a time, its text streamed as it goes.

Shared by the speech families' thinker loops: a sequence of the chat's paged pool whose steps also return the
states their talker reads. `prompt` holds forced_ids, max_tokens, prompt_ids, request.text and request.chat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from vidloom.core.loop import LoopContext
from vidloom.decoding.detokenize import Detokenizer
from vidloom.decoding.sampling import make_generator, next_token


@dataclass
class ReplyState:
    prompt: Any
    seq_id: str
    device: torch.device
    ctx: LoopContext
    detok: Detokenizer
    generator: torch.Generator | None
    feed: list[int]
    cached: int = 0
    reply: list[int] = field(default_factory=list)
    hidden: list[Tensor] = field(default_factory=list)  # per step: the states of the tokens it read
    done: bool = False


def start_reply(network: Any, tokenizer: Any, prompt: Any, ctx: LoopContext, feed: list[int]) -> ReplyState:
    """Reserve the reply's KV (its prompt and the longer of the forced text and the reply budget); `feed` is what
    the first step reads."""
    forced = prompt.forced_ids or ()
    seq_id = ctx.reserve_kv(len(prompt.prompt_ids) + max(len(forced), prompt.max_tokens))
    chat = prompt.request.chat
    generator = make_generator(chat.sampling) if chat is not None else None
    return ReplyState(prompt, seq_id, next(network.parameters()).device, ctx, Detokenizer(tokenizer, ()), generator,
                      feed)


def advance_reply(state: ReplyState, result: tuple[Tensor, Tensor], eos_ids: frozenset[int], phase: str) -> None:
    """After a thinker step (logits, the read tokens' states): a forced reply is the given text (nothing to
    choose); else the next token is chosen with the chat's sampling and fed back, until an end id or the budget."""
    logits, hidden = result
    state.hidden.append(hidden)
    state.cached += len(state.feed)
    forced = state.prompt.forced_ids
    if forced is not None:
        state.reply, state.done = list(forced), True
        state.ctx.emit_text(phase, state.prompt.request.text or "", forced)
        return
    chat = state.prompt.request.chat
    assert chat is not None
    token = next_token(logits, chat.sampling, state.generator)
    state.reply.append(token)
    state.feed = [token]
    text = "" if token in eos_ids else state.detok.add(token)
    state.done = token in eos_ids or len(state.reply) >= state.prompt.max_tokens
    if state.done:
        text += state.detok.flush()
    state.ctx.emit_text(phase, text, (token,))
