"""Estimated peak memory of one Helios request beyond the resident weights (ModelCard.memory_estimator).

Helios denoises one 9-latent-frame chunk at a time while attending to its history (the newest latent frames: short
at the chunk's patch, mid and long pooled 2x and 4x), so a block's working set is one chunk's tokens plus the
history's, whatever num_frames is; batched CFG doubles it. Each chunk is decoded alone by the causal (Wan) VAE, so
the decode term is one chunk's too (one tile's with vae_tile). What grows with num_frames is the decoded video held to the end. Copy counts:
core.footprint.
"""

from __future__ import annotations

from vidloom.core.footprint import (
    Footprint, block_bytes, causal_decode_frames, decode_bytes, decode_pixels, element_size, latent_bytes, part_estimator,
    video_bytes, wan_vae_copies,
)
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.core.request import GenerationRequest
from vidloom.families.helios.loop import CHUNK_LATENT_FRAMES, HISTORY_SIZES
from vidloom.families.helios.transformer import LONG_POOL, MID_POOL
from vidloom.layers.prompt_kv import prompt_kv_bytes
from vidloom.models.wan.text import WAN_TEXT_TOKENS


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The estimator for `instance`; None if it holds no Helios transformer and VAE."""
    return part_estimator(instance, footprint)


def footprint(instance: ModelInstance, request: GenerationRequest) -> Footprint:
    """`request` (resolved) on `instance`, part by part."""
    assert request.height and request.width and request.num_frames, "resolve the request first"
    dit, vae = instance["transformer"].config, instance["vae"].config
    h, w = request.height // vae.spatial_factor, request.width // vae.spatial_factor
    _, p_h, p_w = dit.patch_size
    rows, cols = h // p_h, w // p_w
    long, mid, short = HISTORY_SIZES
    history = ((1 + short) * rows * cols + _pooled(mid, rows, cols, MID_POOL) + _pooled(long, rows, cols, LONG_POOL))
    tokens = CHUNK_LATENT_FRAMES * rows * cols + history
    batch = 2 if request.uses_cfg and instance.deploy.cfg_mode == "batched" else 1
    inner = dit.num_attention_heads * dit.attention_head_dim
    denoise = block_bytes(batch, tokens, inner, dit.ffn_dim, element_size(instance.dtype))
    frames = causal_decode_frames(CHUNK_LATENT_FRAMES, vae.temporal_factor)
    pixels = decode_pixels(request.height, request.width, instance.deploy.vae_tile)
    decode = decode_bytes(instance.device, vae.decoder_dim, pixels, frames, wan_vae_copies(instance.device))
    latents = latent_bytes(dit.in_channels, (1 + CHUNK_LATENT_FRAMES + sum(HISTORY_SIZES)) * h * w)
    # Each CFG branch's prompt K/V, prepared once for the request (diffusion.prompt_kv); batched CFG stacks the
    # pair into one more copy per step.
    prompt = prompt_kv_bytes(dit.num_layers, WAN_TEXT_TOKENS, inner, element_size(instance.dtype))
    denoise += prompt * batch if batch > 1 else 0
    persistent = latents + video_bytes(request.num_frames, request.height, request.width)
    persistent += prompt * (2 if request.uses_cfg else 1)
    return Footprint(denoise=denoise, decode=decode, persistent=persistent)


def _pooled(frames: int, rows: int, cols: int, pool: int) -> int:
    """Tokens of `frames` history frames of rows x cols patches pooled `pool`x in time and space (padded up)."""
    return -(-frames // pool) * -(-rows // pool) * -(-cols // pool)
