"""Estimated peak memory of one LTX-2 request beyond the resident weights (ModelCard.memory_estimator).

Each block carries two streams at once (video tokens and audio tokens, with cross attention between
them), so the denoise term adds both; a two-stage program denoises again at the upsampler's size, so the
term is the larger stage's. The video VAE decodes the whole clip in one pass, whose widest level works at
1/patch of the output size with the decoder's first width, hence `width / patch**2` channels per output
pixel and frame; the vocoder's widest level is its output rate with what is left of its hidden width.
Copy counts: core.footprint.
"""

from __future__ import annotations

import dataclasses
import math

from vidloom.core.footprint import (
    VAE_COPIES, Footprint, block_bytes, decode_bytes, element_size, latent_bytes, video_bytes,
)
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.core.request import GenerationRequest
from vidloom.families.ltx2.settings import LTX2Settings
from vidloom.models.ltx2.text import LTX2_TEXT_TOKENS

FFN_MULT = 4  # models.ltx2.layers.FeedForward: Linear -> GELU -> Linear, 4x wide


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The estimator for `instance`; None if it holds no LTX-2 transformer, VAEs and vocoder."""
    if not {"transformer", "vae", "audio_vae", "vocoder"} <= instance.components.keys():
        return None
    return lambda request: footprint(instance, request).total


def footprint(instance: ModelInstance, request: GenerationRequest) -> Footprint:
    """`request` (resolved) on `instance`, part by part."""
    assert request.height and request.width and request.num_frames and request.fps, "resolve the request first"
    dit, vae = instance["transformer"].config, instance["vae"]
    settings: LTX2Settings = instance["settings"]
    frames = (request.num_frames - 1) // vae.temporal_compression_ratio + 1
    cells = (request.height // vae.spatial_compression_ratio) * (request.width // vae.spatial_compression_ratio)
    seconds = request.num_frames / (float(request.fps) / settings.motion_speed)
    audio_tokens = round(seconds * instance["audio_vae"].config.latents_per_second)
    video_tokens = frames * cells // (dit.patch_size_t * dit.patch_size ** 2)
    act = element_size(instance.dtype)
    # The guidance runs its conditional and unconditional passes as one batch of two (diffusion.av_guidance).
    stage1 = dataclasses.replace(settings.stage1, video_cfg=float(request.guidance_scale or 0.0))
    stage1_batch = 2 if stage1.cfg else 1
    stages = [(video_tokens, stage1_batch)]
    upsampler = instance.components.get("upsampler")
    if upsampler is not None:  # stage 2 at the upsampled size
        scale = upsampler.config.spatial_scale
        stages.append((int(video_tokens * scale * scale), 2 if settings.stage2.cfg else 1))
    video_dim = dit.num_attention_heads * dit.attention_head_dim
    audio_dim = dit.audio_num_attention_heads * dit.audio_attention_head_dim
    # The loop keeps every block's text keys and values per CFG branch when the text modulation is static
    # (diffusion.prompt_kv: one row per prompt of the CFG batch), and the guidance stacks the pair into one more
    # copy for each step's call.
    text_kv = 0
    if not (dit.prompt_modulation and dit.use_prompt_adaln_single):
        text_kv = dit.num_layers * LTX2_TEXT_TOKENS * 2 * (video_dim + audio_dim) * act
    denoise = max(block_bytes(batch, tokens, video_dim, FFN_MULT * video_dim, act)
                  + block_bytes(batch, audio_tokens, audio_dim, FFN_MULT * audio_dim, act)
                  + (2 * batch if batch > 1 else batch) * text_kv
                  for tokens, batch in stages)
    out_h, out_w = request.height, request.width
    if upsampler is not None:
        out_h, out_w = (int(side * upsampler.config.spatial_scale) for side in (request.height, request.width))
    decode = max(_video_decode(instance, out_h * out_w, request.num_frames), _audio_decode(instance, seconds))
    samples = math.ceil(seconds * instance["vocoder"].sample_rate)
    persistent = (latent_bytes(dit.in_channels, max(tokens for tokens, _ in stages))
                  + latent_bytes(dit.audio_in_channels, audio_tokens)
                  + video_bytes(request.num_frames, out_h, out_w) + 2 * samples * 4)
    return Footprint(denoise=denoise, decode=decode, persistent=persistent)


def _video_decode(instance: ModelInstance, pixels: int, frames: int) -> int:
    config = instance["vae"].config
    per_pixel = max(1, config.decoder_block_out_channels[0] // config.patch_size ** 2)
    return decode_bytes(instance.device, per_pixel, pixels, frames)


def _audio_decode(instance: ModelInstance, seconds: float) -> int:
    """The vocoder's widest level: after the last upsampling, hidden width halved once per layer."""
    generator = instance["vocoder"].config.generator
    samples = seconds * instance["vocoder"].sample_rate
    channels = max(1, generator.hidden_channels >> len(generator.upsample_factors))
    copies = VAE_COPIES.get(instance.device.type, VAE_COPIES["cpu"])
    return int(copies * channels * samples * 4)
