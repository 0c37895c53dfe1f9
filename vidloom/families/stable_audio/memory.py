"""Estimated peak memory of one Stable Audio request beyond the resident weights (ModelCard.memory_estimator).

The DiT always runs its whole latent window (sample_size + the global token) against the padded text, whatever
the clip's length; the Oobleck decoder's widest activation is at full audio rate through its first channels.
Copy counts: core.footprint (an audio sample plays the part of a pixel); not yet calibrated by
tests/integration/test_memory_estimates.py.
"""

from __future__ import annotations

from vidloom.core.footprint import FFN_COPIES, Footprint, block_bytes, decode_bytes, element_size, latent_bytes
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.core.request import GenerationRequest
from vidloom.families.stable_audio.transformer import FF_MULT
from vidloom.layers.prompt_kv import prompt_kv_bytes


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The estimator for `instance`; None if it holds no Stable Audio DiT and decoder."""
    if not {"transformer", "vae", "text_encoder"} <= instance.components.keys():
        return None
    return lambda request: footprint(instance, request).total


def footprint(instance: ModelInstance, request: GenerationRequest) -> Footprint:
    dit = instance["transformer"].config
    vae = instance["vae"].config
    text_tokens = instance["text_encoder"].max_length + 2  # the start and end tokens join the text
    batch = 2 if request.uses_cfg and instance.deploy.cfg_mode == "batched" else 1
    tokens = dit.sample_size + 1 + text_tokens
    # SwiGLU: the FFN's projection is twice its width ([tokens, 2 * inner]) beside the gated product.
    denoise = block_bytes(batch, tokens, dit.dim, (FF_MULT * dit.dim * 3) // FFN_COPIES, element_size(instance.dtype))
    samples = dit.sample_size * vae.hop_length
    decode = decode_bytes(instance.device, vae.channels * vae.channel_multiples[0], samples, 1)
    persistent = latent_bytes(dit.in_channels, dit.sample_size) + 2 * vae.audio_channels * samples * 4
    # Each CFG branch's prompt K/V (grouped heads), prepared once for the request (diffusion.prompt_kv); batched CFG
    # stacks the pair into one more copy per step.
    prompt = prompt_kv_bytes(dit.num_layers, text_tokens, dit.num_kv_heads * dit.head_dim, element_size(instance.dtype))
    persistent += prompt * (2 if request.uses_cfg else 1)
    denoise += prompt * batch if batch > 1 else 0
    return Footprint(denoise=denoise, decode=decode, persistent=persistent)
