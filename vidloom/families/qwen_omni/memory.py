"""Estimated peak memory of one speech request beyond the resident weights (ModelCard.memory_estimator).

A speech request runs four stages one after another, so its transient peak is the largest stage's, while
what a stage hands on stays to the end:

- thinker and talker: their K/V lives in the engine's paged pools (one per network), sized at load and resident
  like the weights (the pools' allocators admit each sequence, runtime.paged_kv), so it is not counted again;
  the thinker prefill's activations over the prompt and forced text are, and the per-token hidden states the
  talker reads;
- the audio and vision towers (a chat with such parts, vidloom.models.omni_media; `towers_bytes`, also what a
  text-answer chat adds to its decode working set through MediaChatLoop.media_bytes; vidloom.models.omni_towers):
  one block's activations and attention scores over each part's rows, run inside the prefill step, at least the
  processors' copies on CPU, and their inputs and output rows, held through it;
- talker: one block's activations over its prefill, plus the keys and values its attention gathers from the
  pool over its whole sequence (prompt rows + the code budget, PagedBatch.attend);
- token2wav: the DiT over every mel frame of the code budget in two CFG branches (one block's activations,
  the [frames, frames] attention scores per head, the block mask), the ODE state with RK4's four velocities
  and the conditioning (code and voice embeddings per frame);
- vocoder: its widest activation (channels x samples at each upsampling stage) and the waveform.

The budget of codes is the talker's cap (families.qwen_omni.talker_loop.audio_token_budget), which the run
never exceeds. A streamed request (families.qwen_omni.stream_audio) runs the DiT and the vocoder on one
window at a time: its token2wav and vocoder terms are those of its largest window
(stream_audio.largest_window), plus the utterance's noise buffer and its whole waveform. Copy counts:
core.footprint; checked against peak RSS on CPU by tests/integration/test_memory_estimates.py.
"""

from __future__ import annotations

from typing import Any

from vidloom.core.footprint import FFN_COPIES, VAE_COPIES, Footprint, block_bytes, element_size, part_estimator
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.families.qwen_omni.stream_audio import largest_window
from vidloom.families.qwen_omni.talker_loop import audio_token_budget, talker_tokens
from vidloom.families.qwen_omni.thinker_loop import SpeechPrompt
from vidloom.models.omni_towers import instance_towers_bytes

SWIGLU_FACTOR = 3  # gate and up projections beside their product (the decoders' MLP)
TALKER_EXTRA_ROWS = 4  # talker prefill rows beyond the prompt: the voice's bos, the first reply row, codec bos/pad
ODE_COPIES = 6  # x, RK4's four velocities and the stage input, [frames, mel_dim] each per branch
SCORE_COPIES = 2  # attention scores and their softmax, [heads, frames, frames] per CFG branch
WAVE_COPIES = 3  # the waveform in float32, its int16 and its encoded copy


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The estimator for `instance`; None for a chat-only checkpoint (no talker)."""
    return part_estimator(instance, footprint, needs=("talker",))


def footprint(instance: ModelInstance, prompt: SpeechPrompt) -> Footprint:
    """`prompt` (a validated speech request) on `instance`, part by part."""
    thinker, talker = instance["thinker"].config, instance["talker"].config
    dit, vocoder = (module.config for module in instance["token2wav"])
    act = element_size(instance.dtype)
    tokens = len(prompt.prompt_ids) + prompt.max_tokens
    codes = audio_token_budget(prompt, prompt.max_tokens)
    talker_rows = len(prompt.prompt_ids) + TALKER_EXTRA_ROWS
    # One layer's keys and values gathered from the pool over the whole sequence (the widest step attends to it).
    talker_gather = 2 * talker_tokens(talker_rows, codes) * talker.num_key_value_heads * talker.head_dim * act
    hidden_states = 2 * tokens * thinker.hidden_size * act  # final states + input embeddings, per token
    thinker_pass = block_bytes(1, tokens, thinker.hidden_size, SWIGLU_FACTOR * thinker.intermediate_size, act)
    talker_pass = (block_bytes(1, talker_rows, talker.hidden_size, SWIGLU_FACTOR * talker.intermediate_size, act)
                   + talker_gather)
    dit_frames = vocoder_frames = codes * dit.repeats
    noise = 0
    if prompt.request.audio_chunk_codes is not None:
        dit_frames, vocoder_frames = largest_window(dit, vocoder, prompt.request.audio_chunk_codes, codes)
        noise = codes * dit.repeats * dit.mel_dim * 4
    mel_pass, mel_state = _token2wav(dit, dit_frames)
    samples = codes * dit.repeats * vocoder.hop
    towers = instance_towers_bytes(instance, prompt.media, act)  # a chat answered aloud may carry audio, images
    return Footprint(caches=hidden_states + noise,
                     denoise=max(thinker_pass + towers, talker_pass, mel_pass),
                     decode=_vocoder(instance, vocoder, vocoder_frames),
                     persistent=mel_state + WAVE_COPIES * samples * 4)


def _token2wav(dit: Any, frames: int) -> tuple[int, int]:
    """(one DiT block's live bytes over `frames` mel frames in both CFG branches, the ODE state's bytes);
    token2wav runs in float32."""
    inner = dit.num_attention_heads * dit.head_dim
    block = block_bytes(2, frames, max(inner, dit.hidden_size), dit.hidden_size * dit.ff_mult, 4)
    # the scores and their softmax per head and branch (CPU attention with a mask materialises them), the mask
    scores = 2 * SCORE_COPIES * dit.num_attention_heads * frames * frames * 4 + frames * frames
    conditioning = 2 * frames * (dit.emb_dim + dit.enc_emb_dim + dit.hidden_size) * 4
    state = 2 * ODE_COPIES * frames * dit.mel_dim * 4 + conditioning
    return block + scores, state


def _vocoder(instance: ModelInstance, vocoder: Any, frames: int) -> int:
    """The widest stage of the BigVGAN (its channels halve as its length multiplies), at the deployment's copies."""
    copies = VAE_COPIES.get(instance.device.type, VAE_COPIES["cpu"])
    length, channels, widest = frames, vocoder.upsample_initial_channel, vocoder.upsample_initial_channel * frames
    for rate in vocoder.upsample_rates:
        length, channels = length * rate, max(1, channels // 2)
        widest = max(widest, channels * length)
    return copies * widest * 4 + FFN_COPIES * vocoder.mel_dim * frames * 4
