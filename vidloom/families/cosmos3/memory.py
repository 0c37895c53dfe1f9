"""Estimated peak memory of one Cosmos3 request beyond the resident weights (ModelCard.memory_estimator).

Generation: each CFG branch's text prefix is prefilled once and its per-layer K/V held for the whole
denoise (cache_prefix), padded to its prompt-length bucket under cuda_graphs (runtime.prompt_buckets.bucket_length: a
static buffer the request holds, counted here like any prefix; once it is idle the request ledger holds an entry for
it, runtime.static_buffers); a reasoning request first holds the reasoner's K/V buffer for its prompt plus
REASON_MAX_TOKENS. The denoise forward runs the vision (and sound) tokens of every branch through the
Qwen3-style blocks (SwiGLU MLP); the Wan VAE decodes one latent frame at a time as in families/wan; the
sound decoder's widest level is its waveform rate. Copy counts: core.footprint. Chat sequences take
their KV from the paged pool, which is sized at load and resident like the weights; the pool's
allocator admits each sequence (runtime.paged_kv).
"""

from __future__ import annotations

from vidloom.core.footprint import (
    VAE_COPIES, Footprint, wan_vae_copies, block_bytes, decode_bytes, element_size, latent_bytes, video_bytes,
)
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.core.request import GenerationRequest
from vidloom.families.cosmos3.reason import REASON_MAX_TOKENS
from vidloom.runtime.prompt_buckets import bucket_length

# Tokens the generation templates add around a prompt (system prompt, the shape sentence, chat markup).
# A prompt of n characters tokenizes to at most n tokens, so the prefix is bounded by n + this.
TEMPLATE_TOKENS = 256
SWIGLU_FACTOR = 3  # gate and up projections beside their product, [tokens, intermediate_size] each


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The estimator for `instance`; None for a chat-only folder (no generator and VAE)."""
    if not {"generator", "vae", "transformer"} <= instance.components.keys():
        return None
    return lambda request: footprint(instance, request).total


def kv_bytes(instance: ModelInstance, tokens: int) -> int:
    """Every layer's keys and values for `tokens` positions of the text pathway."""
    text = instance["generator"].config.text
    return 2 * text.num_hidden_layers * tokens * text.num_key_value_heads * text.head_dim * element_size(instance.dtype)


def footprint(instance: ModelInstance, request: GenerationRequest) -> Footprint:
    """`request` (resolved) on `instance`, part by part."""
    assert request.height and request.width and request.num_frames and request.fps, "resolve the request first"
    config = instance["generator"].config
    vae = instance["vae"].config
    guided = request.guidance_scale is not None and request.guidance_scale != 1.0  # gen_program.uses_guidance
    branches = 2 if guided else 1
    prompt = len(request.prompt) + (REASON_MAX_TOKENS if request.option("reason") else 0)
    negative = len(request.negative_prompt or "") if guided else 0
    prefix = bucket_length if instance.deploy.cuda_graphs else int  # int: the prompt's own token count
    prefixes = kv_bytes(instance, prefix(prompt + TEMPLATE_TOKENS)) + (
        kv_bytes(instance, prefix(negative + TEMPLATE_TOKENS)) if guided else 0)
    reasoner = kv_bytes(instance, len(request.prompt) + TEMPLATE_TOKENS + REASON_MAX_TOKENS) if request.option("reason") else 0

    latent_frames = vae.latent_frames(request.num_frames)
    h, w = request.height // vae.spatial_factor, request.width // vae.spatial_factor
    p = config.latent_patch_size
    vision = latent_frames * -(-h // p) * -(-w // p)
    sound_steps, samples = _sound(instance, request)
    text = config.text
    denoise = block_bytes(branches, vision + sound_steps, text.hidden_size, SWIGLU_FACTOR * text.intermediate_size,
                          element_size(instance.dtype))
    pixels = request.height * request.width
    frames_per_chunk = 1 if latent_frames == 1 else vae.temporal_factor + 2  # families/wan/memory.py's rule
    vision_decode = decode_bytes(instance.device, vae.decoder_dim, pixels, frames_per_chunk,
                                 wan_vae_copies(instance.device))
    decode = max(vision_decode, _sound_decode(instance, samples))
    frames = video_bytes(request.num_frames, request.height, request.width)
    persistent = latent_bytes(vae.z_dim, latent_frames * h * w) + frames + 2 * samples * 4
    return Footprint(caches=max(prefixes, reasoner), denoise=denoise, decode=decode, persistent=persistent)


def _sound(instance: ModelInstance, request: GenerationRequest) -> tuple[int, int]:
    """(sound latent steps, waveform samples) of a `sound` request; (0, 0) otherwise."""
    decoder = instance.components.get("sound_decoder")
    if not request.option("sound") or decoder is None:
        return 0, 0
    steps = decoder.config.latent_steps(request.num_frames, float(request.fps))
    return steps, steps * decoder.config.hop_size


def _sound_decode(instance: ModelInstance, samples: int) -> int:
    decoder = instance.components.get("sound_decoder")
    if decoder is None or samples == 0:
        return 0
    config = decoder.config
    copies = VAE_COPIES.get(instance.device.type, VAE_COPIES["cpu"])
    return copies * config.channels * max(config.channel_mults) * samples * 4
