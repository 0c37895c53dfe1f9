"""The talker stage of speech: codec codes from the thinker's states, one runtime step per code.

Its KV is a sequence of the engine's paged pool for the talker (its own layout: the talker's layers, heads
and head size; the program names the talker in `paged_networks`), reserved at init and returned when the
loop ends, whatever ends it; when other talkers hold the blocks, the runtime retries init on a later round. Its steps are paged decode plans fed input rows (`INPUT_EMBEDS`), so the talker
steps of concurrent speech requests run as one batched forward, as chats do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.chat import SamplingParams
from vidloom.core.loop import DONE, KV_SEQUENCE, Done, LoopContext, StepPlan
from vidloom.core.speech import MAX_AUDIO_TOKENS
from vidloom.decoding.sampling import make_generator, next_token
from vidloom.families.qwen_omni.config import TalkerTokens
from vidloom.families.qwen_omni.decoder import OmniDecoder
from vidloom.layers.rotary import text_positions
from vidloom.families.qwen_omni.talker_inputs import (
    PREFILL_EXTRA_ROWS,
    TalkerInputs,
    shape_logits,
    step_input,
    talker_inputs,
)
from vidloom.families.qwen_omni.stream_audio import STREAM, AudioPiece, AudioStream, decode_chunk, open_stream
from vidloom.families.qwen_omni.thinker_loop import SpeechPrompt, ThinkerOutput
from vidloom.runtime.paged_decode import INPUT_EMBEDS

TALKER = "talker"
CODES_PER_TEXT_TOKEN = 16  # ~0.3 s of speech (50 codes/s) per text token: a cap for talkers that never stop
MIN_AUDIO_TOKENS = 64


@dataclass
class TalkerState:
    inputs: TalkerInputs
    seq_id: str | None  # its paged KV sequence; None: nothing to say
    max_codes: int
    params: SamplingParams
    generator: torch.Generator | None
    ctx: LoopContext
    x: Tensor
    position: int = 0
    seen: set[int] = field(default_factory=set)
    codes: list[int] = field(default_factory=list)
    done: bool = False
    stream: AudioStream | None = None  # a streamed request's chunked token2wav + vocoder
    sample_rate: int = 0


def audio_token_budget(prompt: SpeechPrompt, reply_tokens: int) -> int:
    """The request's max_audio_tokens, else a cap from the reply's length (a talker that never emits its end
    token, such as a random one, stops there)."""
    if prompt.request.max_audio_tokens is not None:
        return prompt.request.max_audio_tokens
    return min(MAX_AUDIO_TOKENS, max(MIN_AUDIO_TOKENS, CODES_PER_TEXT_TOKEN * reply_tokens))


def talker_tokens(prefill_rows: int, max_codes: int) -> int:
    """The talker sequence's KV tokens: its prefill rows and a row per code (the last code's is never fed back:
    one spare, as the slab it replaced had)."""
    return prefill_rows + max_codes


class TalkerLoop:
    """Codes one step at a time; for a streamed request (`audio_chunk_codes`), a chunk-decode step between
    them whenever a chunk's look-ahead has arrived (families.qwen_omni.stream_audio), and the rest at the end."""

    name = TALKER

    def __init__(self, thinker: OmniDecoder, talker: OmniDecoder, tokens: TalkerTokens,
                 token2wav: tuple[Any, Any] | None = None, sample_rate: int = 24000) -> None:
        self.thinker, self.talker, self.tokens = thinker, talker, tokens
        self.token2wav, self.sample_rate = token2wav, sample_rate
        self.end_ids = frozenset({tokens.codec_pad, tokens.codec_end})  # generate()'s talker_eos_token_id

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> TalkerState:
        prompt: SpeechPrompt = slots["speech"]
        out: ThinkerOutput = slots["thinker"]
        param = next(self.talker.parameters())
        sampling = prompt.request.talker_sampling
        if prompt.request.seed is not None and not sampling.greedy:
            sampling = dataclasses.replace(sampling, seed=prompt.request.seed)
        if len(out.fed_ids) == 0:  # the reply ended at once (its first token was the end): nothing to say
            return TalkerState(TalkerInputs(param.new_zeros(0), param.new_zeros(0), []), None, 0, sampling, None,
                               ctx, param.new_zeros(0), done=True)
        # Reserved first: a busy pool (KVPoolBusy) makes the runtime retry init later, so a try costs nothing else.
        max_codes = audio_token_budget(prompt, len(out.reply_ids))
        prefill_rows = len(out.prompt_ids) + PREFILL_EXTRA_ROWS
        seq_id = ctx.reserve_kv(talker_tokens(prefill_rows, max_codes), network=self.talker)
        inputs = talker_inputs(self.thinker, self.talker, self.tokens, prompt.voice.bos_token, out.prompt_ids,
                               out.fed_ids, out.hidden, out.media_at)
        assert inputs.prefill.shape[0] == prefill_rows, "talker prefill rows differ from what was reserved"
        stream = None
        if prompt.request.audio_chunk_codes is not None and self.token2wav is not None:
            stream = open_stream(*self.token2wav, prompt.voice, max_codes, prompt.request.audio_chunk_codes,
                                 prompt.request.ode_steps, prompt.request.seed)
        return TalkerState(inputs, seq_id, max_codes, sampling, make_generator(sampling), ctx, inputs.prefill,
                           seen=set(inputs.prompt_codes), stream=stream, sample_rate=self.sample_rate)

    def next(self, state: TalkerState) -> StepPlan | Done:
        stream = state.stream
        if stream is not None and stream.ready(len(state.codes), state.done):
            return StepPlan(loop=STREAM, index=len(stream.pieces), total=stream.chunk_count(state.max_codes),
                            call=decode_chunk, inputs=stream.plan_inputs(state.codes, state.done))
        if state.done:
            return DONE
        return StepPlan(loop=TALKER, index=len(state.codes), total=state.max_codes, call=self.talker,
                        inputs={INPUT_EMBEDS: state.x, KV_SEQUENCE: state.seq_id, "start": state.position,
                                "positions": text_positions(state.position, state.x.shape[0], state.x.device)})

    def advance(self, state: TalkerState, logits: Tensor | AudioPiece) -> TalkerState:
        if isinstance(logits, AudioPiece):
            assert state.stream is not None
            start = sum(len(p) for p in state.stream.pieces)
            state.stream.add(logits)
            state.ctx.emit_audio(logits.index, start, logits.samples, state.sample_rate)
            return state
        state.position += state.x.shape[0]
        code = next_token(shape_logits(logits, state.seen, self.tokens), state.params, state.generator)
        if code in self.end_ids:
            state.done = True
            return state
        state.codes.append(code)
        state.seen.add(code)
        state.done = len(state.codes) >= state.max_codes
        state.x = step_input(self.talker, state.inputs, len(state.codes), code)
        return state

    def finalize(self, state: TalkerState) -> dict[str, Any]:
        streamed = None if state.stream is None else state.stream.audio()
        return {"codes": torch.tensor(state.codes, dtype=torch.long), "streamed": streamed}
