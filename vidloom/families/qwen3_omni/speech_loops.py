"""Speech as runtime stages: thinker (reply and its states) -> talker (codec frames) -> code2wav (waveform).

The thinker is a sequence of the chat's paged pool, stepped as paged decode plans that ask for the state at the
talker's accept_hidden_layer (`WANT_HIDDEN`); the talker a sequence of its own paged pool (the program names its
decoder in `paged_networks`), so concurrent requests' talker steps run as one batched forward. After each talker
step the code predictor chooses the frames' other codebooks, once for every talker sequence of the step (the
talker plans' `AFTER_FORWARD`: each sequence's first code by its own sampler, then one batched predictor forward;
every sequence is at the same predictor position, so nothing is padded). A streamed request (`audio_chunk_codes`) gets a
code2wav step whenever a chunk of frames is ready; otherwise code2wav runs after the talker, a chunk per step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from vidloom.core.chat import SamplingParams
from vidloom.core.loop import DONE, KV_SEQUENCE, Done, LoopContext, StepPlan
from vidloom.core.speech import MAX_AUDIO_TOKENS, TALKER_SAMPLING, SpeechRequest
from vidloom.decoding.sampling import make_generator, next_token
from vidloom.decoding.spoken_reply import ReplyState, advance_reply, start_reply
from vidloom.families.qwen3_omni.code2wav import CHUNK_FRAMES, SAMPLE_RATE, WaveChunks, decode_chunk
from vidloom.families.qwen3_omni.decoder import MoEDecoder
from vidloom.families.qwen3_omni.speech_codes import TalkerInputs, next_frames, shape_logits, talker_inputs
from vidloom.families.qwen3_omni.talker import Pick, Talker
from vidloom.models.omni_media import MediaPrompter, PromptMedia, thinker_positions
from vidloom.runtime.paged_decode import AFTER_FORWARD, EMBEDS_AT, INPUT_EMBEDS, WANT_HIDDEN

THINKER, TALKER, CODE2WAV, STREAM = "thinker", "talker", "code2wav", "code2wav_stream"
TRANSCRIPT_PHASE = "transcript"
# generate()'s samplers: the talker's (talker_temperature, talker_top_k, talker_top_p defaults) and the code
# predictor's (top_k 50, top_p 0.8, its generation config's temperature 1.0).
QWEN3_TALKER_SAMPLING = SamplingParams(temperature=0.9, top_k=50, top_p=1.0)
PREDICTOR_SAMPLING = SamplingParams(temperature=1.0, top_k=50, top_p=0.8)
FRAMES_PER_TEXT_TOKEN = 16  # a cap for talkers that never stop (12.5 frames/s: over a second per token)
MIN_FRAMES = 64
TALKER_STATE = "talker_state"  # a talker plan's input: its sequence's TalkerState (read by TalkerLoop.choose_frames)


@dataclass(frozen=True)
class SpeechPrompt:
    """The `speech` slot: a validated request, its voice (name, codec id), prompt ids, forced reply and budget."""

    request: SpeechRequest
    voice: str
    voice_id: int
    prompt_ids: tuple[int, ...]
    forced_ids: tuple[int, ...] | None  # the text to say, ended by the turn's end id
    max_tokens: int
    media: PromptMedia | None = None  # the prompt's audio, image and video parts (a chat's), None: text only


@dataclass(frozen=True)
class ThinkerOutput:
    ids: tuple[int, ...]  # prompt + reply
    prompt_len: int
    tapped: Tensor  # [len(ids) - 1, thinker hidden]: the states of every id read
    reply_ids: tuple[int, ...]
    text: str


class SpeechThinkerLoop:
    name = THINKER

    def __init__(self, network: MoEDecoder, tokenizer: Any, eos_ids: tuple[int, ...], prompter: MediaPrompter) -> None:
        self.network, self.tokenizer, self.eos_ids, self.prompter = network, tokenizer, frozenset(eos_ids), prompter

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> ReplyState:
        prompt: SpeechPrompt = slots["speech"]
        # A forced reply is read whole but its end id (never read: the talker's prompt ends before it).
        return start_reply(self.network, self.tokenizer, prompt, ctx,
                           list(prompt.prompt_ids) + list((prompt.forced_ids or ())[:-1]))

    def next(self, state: ReplyState) -> StepPlan | Done:
        if state.done:
            return DONE
        media = state.prompt.media
        inputs = {"tokens": torch.tensor(state.feed, device=state.device),
                  "positions": thinker_positions(media, state.cached, len(state.feed), state.device),
                  KV_SEQUENCE: state.seq_id, "start": state.cached, WANT_HIDDEN: True}
        if media is not None and state.cached == 0:  # the towers run inside the prefill step
            inputs[EMBEDS_AT] = self.prompter.prefill_embeds(media, next(self.network.parameters()).dtype,
                                                             state.device)
        return StepPlan(loop=THINKER, index=len(state.reply), total=None, call=self.network, inputs=inputs)

    def advance(self, state: ReplyState, result: tuple[Tensor, Tensor]) -> ReplyState:
        advance_reply(state, result, self.eos_ids, TRANSCRIPT_PHASE)
        return state

    def finalize(self, state: ReplyState) -> dict[str, Any]:
        ids = tuple(state.prompt.prompt_ids) + tuple(state.reply)
        request = state.prompt.request
        text = request.text if state.prompt.forced_ids is not None else state.detok.text
        return {"thinker": ThinkerOutput(ids, len(state.prompt.prompt_ids), torch.cat(state.hidden)[:len(ids) - 1],
                                         tuple(state.reply), text or "")}


def frame_budget(prompt: SpeechPrompt, reply_tokens: int) -> int:
    """The request's max_audio_tokens (frames), else a cap from the reply's length."""
    if prompt.request.max_audio_tokens is not None:
        return prompt.request.max_audio_tokens
    return min(MAX_AUDIO_TOKENS, max(MIN_FRAMES, FRAMES_PER_TEXT_TOKEN * reply_tokens))


def talker_sampling(request: SpeechRequest) -> SamplingParams:
    """The request's talker sampling (the core default stands for Qwen3-Omni's own), seeded by the request."""
    sampling = QWEN3_TALKER_SAMPLING if request.talker_sampling is TALKER_SAMPLING else request.talker_sampling
    if request.seed is not None and not sampling.greedy:
        sampling = dataclasses.replace(sampling, seed=request.seed)
    return sampling


@dataclass
class TalkerState:
    inputs: TalkerInputs | None
    seq_id: str | None
    max_frames: int
    params: SamplingParams
    generator: torch.Generator | None
    ctx: LoopContext
    x: Tensor | None
    position: int = 0
    frames: list[Tensor] = field(default_factory=list)
    done: bool = False
    chunks: WaveChunks | None = None


@dataclass(frozen=True)
class FrameChoice:
    """One talker sequence's step: its next frame's codes [G] and input row [1, hidden], or None: its end."""

    frame: Tensor | None
    x: Tensor | None = None


class TalkerLoop:
    """Frames one talker step at a time; for a streamed request a code2wav step whenever a chunk is ready."""

    name = TALKER

    def __init__(self, thinker: MoEDecoder, talker: Talker, code2wav: Any, eos_ids: tuple[int, ...]) -> None:
        self.thinker, self.talker, self.code2wav, self.eos_ids = thinker, talker, code2wav, eos_ids

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> TalkerState:
        prompt: SpeechPrompt = slots["speech"]
        out: ThinkerOutput = slots["thinker"]
        params = talker_sampling(prompt.request)
        if len(out.ids) - out.prompt_len < 2:  # the reply ended at once: nothing to say
            return TalkerState(None, None, 0, params, None, ctx, None, done=True)
        with torch.inference_mode():
            inputs = talker_inputs(self.talker, self.thinker.embed, out.ids, out.prompt_len, out.tapped,
                                   prompt.voice_id, self.eos_ids, prompt.media)
        max_frames = frame_budget(prompt, len(out.reply_ids))
        seq_id = ctx.reserve_kv(inputs.prefill.shape[0] + max_frames, network=self.talker.decoder)
        chunk = prompt.request.audio_chunk_codes
        return TalkerState(inputs, seq_id, max_frames, params, make_generator(params), ctx, inputs.prefill,
                           chunks=WaveChunks(chunk) if chunk is not None else None)

    def next(self, state: TalkerState) -> StepPlan | Done:
        chunks = state.chunks
        if chunks is not None and chunks.ready(len(state.frames), state.done):
            stop = chunks.stop(len(state.frames))
            return StepPlan(loop=STREAM, index=len(chunks.pieces), total=chunks.count(state.max_frames),
                            call=decode_chunk, inputs={"code2wav": self.code2wav, "frames": torch.stack(state.frames),
                                                       "start": chunks.emitted, "stop": stop,
                                                       "left_context": chunks.left_context, "spoken": chunks.spoken})
        if state.done or state.x is None or state.inputs is None:
            return DONE
        return StepPlan(loop=TALKER, index=len(state.frames), total=state.max_frames, call=self.talker.decoder,
                        inputs={INPUT_EMBEDS: state.x, KV_SEQUENCE: state.seq_id, "start": state.position,
                                "positions": state.inputs.step_positions(state.position, state.x.shape[0]),
                                WANT_HIDDEN: True, AFTER_FORWARD: self.choose_frames, TALKER_STATE: state})

    def choose_frames(self, plans: Sequence[StepPlan], rows: Sequence[tuple[Tensor, Tensor]]) -> list[FrameChoice]:
        """One talker step's rows (logits, hidden) -> each sequence's FrameChoice: its first code by its own sampler,
        then the code predictor once for every sequence that goes on."""
        s = self.talker.speech
        going: list[tuple[int, TalkerState, int, Tensor]] = []
        for i, (plan, (logits, hidden)) in enumerate(zip(plans, rows)):
            state: TalkerState = plan.inputs[TALKER_STATE]
            code = next_token(shape_logits(logits, [int(f[0]) for f in state.frames], s), state.params,
                              state.generator)
            if code != s.codec_eos and len(state.frames) < state.max_frames:
                going.append((i, state, code, hidden[-1]))
        choices = [FrameChoice(None)] * len(plans)
        if not going:
            return choices
        states = [state for _, state, _, _ in going]
        assert states[0].x is not None
        with torch.inference_mode():
            frames, xs = next_frames(self.talker, [st.inputs for st in states], [len(st.frames) for st in states],
                                     [code for _, _, code, _ in going],
                                     torch.stack([h for *_, h in going]).to(states[0].x.device), _pick_rest(states))
        for (i, *_), frame, x in zip(going, frames, xs):
            choices[i] = FrameChoice(frame, x[None])
        return choices

    def advance(self, state: TalkerState, result: Any) -> TalkerState:
        if isinstance(result, np.ndarray):  # a streamed chunk's samples
            assert state.chunks is not None
            start = state.chunks.spoken
            state.chunks.add(result, state.chunks.stop(len(state.frames)))
            state.ctx.emit_audio(len(state.chunks.pieces) - 1, start, result, SAMPLE_RATE)
            return state
        assert isinstance(result, FrameChoice) and state.x is not None
        state.position += state.x.shape[0]
        if result.frame is None:
            state.done = True
            return state
        state.frames.append(result.frame)
        state.x = result.x
        return state

    def finalize(self, state: TalkerState) -> dict[str, Any]:
        groups = self.talker.speech.code_groups
        frames = torch.stack(state.frames).cpu() if state.frames else torch.zeros(0, groups, dtype=torch.long)
        return {"codes": frames[:, 0], "frames": frames,
                "streamed": None if state.chunks is None else state.chunks.audio()}


def _pick_rest(states: Sequence[TalkerState]) -> Pick:
    """The code predictor's choice for each sequence's row: greedy, or its sampler (PREDICTOR_SAMPLING) drawing
    from its own generator."""
    if all(state.params.greedy for state in states):
        return lambda logits, group: logits.argmax(-1)

    def pick(logits: Tensor, group: int) -> Tensor:
        rows = logits.cpu()
        return torch.tensor([int(row.argmax()) if state.params.greedy
                             else next_token(row, PREDICTOR_SAMPLING, state.generator)
                             for row, state in zip(rows, states)], device=logits.device)

    return pick


class Code2WavLoop:
    """The whole utterance's frames -> samples, a chunk of CHUNK_FRAMES per step (generate()'s chunked decode);
    a streamed request's audio is already out: its pieces' sum."""

    name = CODE2WAV

    def __init__(self, code2wav: Any) -> None:
        self.code2wav = code2wav

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> dict[str, Any]:
        return {"frames": slots["frames"], "streamed": slots.get("streamed"), "voice": slots["speech"].voice,
                "chunks": WaveChunks(CHUNK_FRAMES)}

    def next(self, run: dict[str, Any]) -> StepPlan | Done:
        chunks, frames = run["chunks"], run["frames"]
        if run["streamed"] is not None or not chunks.ready(len(frames), True):
            return DONE
        return StepPlan(loop=CODE2WAV, index=len(chunks.pieces), total=chunks.count(len(frames)), call=decode_chunk,
                        inputs={"code2wav": self.code2wav, "frames": frames, "start": chunks.emitted,
                                "stop": chunks.stop(len(frames)), "left_context": chunks.left_context,
                                "spoken": chunks.spoken})

    def advance(self, run: dict[str, Any], samples: np.ndarray) -> dict[str, Any]:
        run["chunks"].add(samples, run["chunks"].stop(len(run["frames"])))
        return run

    def finalize(self, run: dict[str, Any]) -> dict[str, Any]:
        audio = run["streamed"] if run["streamed"] is not None else run["chunks"].audio()
        return {"audio": audio, "sample_rate": SAMPLE_RATE, "voice": run["voice"]}
