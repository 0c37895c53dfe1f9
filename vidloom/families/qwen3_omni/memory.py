"""Estimated peak memory of one Qwen3-Omni speech request beyond the resident weights (ModelCard.memory_estimator).

The stages run one after another (thinker -> talker with its code predictor -> code2wav), so the transient peak is
the largest stage's, while what a stage hands on stays to the end:

- thinker and talker: their K/V lives in the engine's paged pools (sized at load, resident like the weights), so
  it is not counted again. The thinker's prefill over the prompt and its reply (forced text, or the reply budget)
  is: one MoE block's activations (its top-k experts' and the router's rows, `MoEDecoderConfig.intermediate_size`),
  the keys and values gathered from the pool over its context and the attention scores (float32 where a math
  kernel materialises them); its tapped states per token are held for the talker;
- the audio and vision towers (a chat answered aloud with such parts), run inside the thinker's prefill:
  `towers_bytes` (vidloom.models.omni_towers), as a text-answer chat's MediaChatLoop.media_bytes counts them;
- talker: its inputs (both resize MLPs run over every token read, speech_codes._user_rows), then one MoE block
  over its prefill rows (the prompt's, its media placeholders included, + 9 assistant rows) and the keys and
  values it gathers over prefill + frames;
- code predictor: G + 1 rows per step, negligible beside the talker but for its per-group logits;
- code2wav: one window of frames (generate()'s 300-frame chunks with 25 of left context, or a streamed request's
  chunk with its context): its transformer block and scores over the window, then the widest stage of its
  upsampler and conv decoder (channels x samples, at core.footprint's VAE copies); the frames and the waveform
  are held to the end.

Copy counts: core.footprint; checked against peak RSS on CPU by tests/integration/test_memory_estimates.py.
"""

from __future__ import annotations

import math
from typing import Any

from vidloom.core.footprint import VAE_COPIES, Footprint, block_bytes, element_size, part_estimator
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.families.qwen3_omni.code2wav import CHUNK_FRAMES, LEFT_CONTEXT
from vidloom.families.qwen3_omni.config import MoEDecoderConfig
from vidloom.families.qwen3_omni.speech_loops import SpeechPrompt, frame_budget
from vidloom.models.omni_towers import instance_towers_bytes

SWIGLU_FACTOR = 3  # gate and up projections beside their product
TALKER_HEAD_ROWS = 9  # the assistant turn's rows in the talker's prefill (speech_codes.talker_inputs)
SCORE_COPIES = 2  # attention scores and their softmax
WAVE_COPIES = 3  # the waveform in float32, its int16 and its encoded copy


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The estimator for `instance`; None for a chat-only checkpoint (no talker)."""
    return part_estimator(instance, footprint, needs=("talker",))


def footprint(instance: ModelInstance, prompt: SpeechPrompt) -> Footprint:
    """`prompt` (a validated speech request) on `instance`, part by part."""
    thinker, talker, speech = instance["thinker"].config, instance["talker"], instance["speech"]
    act = element_size(instance.dtype)
    tokens = len(prompt.prompt_ids) + prompt.max_tokens
    frames = frame_budget(prompt, prompt.max_tokens)
    rows = len(prompt.prompt_ids) + TALKER_HEAD_ROWS
    talker_config: MoEDecoderConfig = talker.decoder.config
    tapped = 2 * tokens * thinker.hidden_size * act  # the states and their concatenation
    talker_in = 2 * tokens * (talker_config.dense_intermediate_size + talker_config.hidden_size) * act
    predictor = (speech.code_groups - 1) * speech.predictor.vocab_size * 4
    chunk = prompt.request.audio_chunk_codes or CHUNK_FRAMES
    window = min(frames, chunk + LEFT_CONTEXT)
    code2wav = instance["code2wav"]
    samples = frames * int(code2wav.total_upsample)
    held = frames * speech.code_groups * 8 * 2 + WAVE_COPIES * samples * 4
    towers = instance_towers_bytes(instance, prompt.media, act)
    return Footprint(caches=tapped + talker_in,
                     denoise=max(_decoder_pass(thinker, tokens, tokens, act) + thinker.vocab_size * 4 + towers,
                                 _decoder_pass(talker_config, rows, rows + frames, act) + predictor),
                     decode=_code2wav(instance, code2wav.config, window),
                     persistent=held)


def _decoder_pass(config: MoEDecoderConfig, tokens: int, context: int, act: int) -> int:
    """One block over `tokens` new tokens attending to `context`: activations, gathered K/V, scores and mask."""
    block = block_bytes(1, tokens, config.hidden_size, SWIGLU_FACTOR * config.intermediate_size, act)
    gathered = 2 * context * config.num_key_value_heads * config.head_dim * act
    scores = tokens * context * (1 + SCORE_COPIES * config.num_attention_heads * 4)
    return block + gathered + scores


def _code2wav(instance: ModelInstance, config: Any, frames: int) -> int:
    """One window of `frames` through code2wav (float32): its transformer block and scores, then the widest stage
    of the ConvNeXt upsampler and the conv decoder (channels halve as the length multiplies)."""
    block = block_bytes(1, frames, config.hidden_size, SWIGLU_FACTOR * config.intermediate_size, 4)
    scores = SCORE_COPIES * config.num_attention_heads * frames * frames * 4
    length = frames * math.prod(config.upsampling_ratios)
    channels, widest = config.decoder_dim, max(config.hidden_size, config.decoder_dim) * length
    for rate in config.upsample_rates:
        length, channels = length * rate, max(1, channels // 2)
        widest = max(widest, channels * length)
    copies = VAE_COPIES.get(instance.device.type, VAE_COPIES["cpu"])
    return block + scores + copies * widest * 4
