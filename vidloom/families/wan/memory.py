"""Estimated peak memory of one Wan2.1 request beyond the resident weights (ModelCard.memory_estimator).

The peak is the larger of one DiT block's activations during denoising and one latent
frame's VAE decode, plus what lives through the whole run (latents, sampler history,
the decoded video). The per-element copy counts (core.footprint, shared with the other
families) were first calibrated here against peak RSS of demo-model runs on CPU in float32
(256x256 .. 1024x1024, 1 .. 1025 frames) and rounded up: the estimate is meant to refuse a
request that cannot fit, not to pack memory tightly.
"""

from __future__ import annotations

from functools import partial

import torch

from vidloom.core.footprint import (
    FFN_COPIES, FIXED_OVERHEAD, HIDDEN_COPIES, LATENT_COPIES, wan_vae_copies, causal_decode_frames, decode_pixels,
)
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.core.request import GenerationRequest
from vidloom.layers.prompt_kv import prompt_kv_bytes
from vidloom.models.wan.text import WAN_TEXT_TOKENS


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The estimator for `instance` (ModelCard.memory_estimator); None if it holds no Wan DiT and VAE."""
    if not {"transformer", "vae"} <= instance.components.keys():
        return None
    if not all(hasattr(instance[name], "config") for name in ("transformer", "vae")):
        return None
    return partial(estimate_request_bytes, instance)


def estimate_request_bytes(instance: ModelInstance, request: GenerationRequest) -> int:
    """Bytes `request` (resolved) needs on `instance`'s device while it runs."""
    assert request.height and request.width and request.num_frames, "resolve the request first"
    dit = instance["transformer"].config
    vae = instance["vae"].config
    act = torch.empty((), dtype=instance.dtype).element_size()
    latent_frames = vae.latent_frames(request.num_frames)
    latent_h, latent_w = request.height // vae.spatial_factor, request.width // vae.spatial_factor
    _, p_h, p_w = dit.patch_size
    tokens = latent_frames * (latent_h // p_h) * (latent_w // p_w)
    batch = 2 if request.uses_cfg and instance.deploy.cfg_mode == "batched" else 1
    denoise = batch * tokens * (HIDDEN_COPIES * dit.inner_dim + FFN_COPIES * dit.ffn_dim) * act
    pipeline = instance.components.get("wan_pipeline")
    if getattr(pipeline, "expand_timesteps", False):
        # Wan2.2 TI2V: a modulation row per token ([B, S, 6, D] in the activation dtype, plus the float32
        # sum each block forms from it), as diffusers' per-token timesteps need.
        denoise += batch * tokens * 6 * dit.inner_dim * (act + 4)

    # The loop keeps every block's prompt keys/values per CFG branch and expert for the request (diffusion.prompt_kv),
    # and batched CFG stacks the pair into one more copy for each step's call.
    branches = 2 if request.uses_cfg else 1
    experts = 2 if "transformer_2" in instance.components else 1
    prompt_row = prompt_kv_bytes(dit.num_layers, WAN_TEXT_TOKENS, dit.inner_dim, act)
    prompt_kv = prompt_row * branches * experts
    denoise += prompt_row * batch if batch > 1 else 0
    # Wan2.1 I2V: every block's CLIP image keys/values once per request and expert, repeated per branch when batched.
    image_row = prompt_kv_bytes(dit.num_layers, _image_tokens(instance), dit.inner_dim, act)
    prompt_kv += image_row * experts
    denoise += image_row * batch if batch > 1 else 0

    # Wan2.2's VAE (patch 2) decodes to a grid of 1/patch the size per side and unfolds it into pixels at the end,
    # so its widest stage holds decoder_dim channels over pixels / patch^2 positions.
    pixels = decode_pixels(request.height, request.width, instance.deploy.vae_tile) // (vae.patch_size or 1) ** 2
    frames_per_chunk = causal_decode_frames(latent_frames, vae.temporal_factor)
    copies = wan_vae_copies(instance.device)
    decode = copies * vae.decoder_dim * pixels * frames_per_chunk * 4

    latents = LATENT_COPIES * dit.in_channels * latent_frames * latent_h * latent_w * 4
    video = request.num_frames * request.height * request.width * 3 * (4 + 1)  # float32 frames + uint8 copy
    return FIXED_OVERHEAD + max(denoise, decode) + latents + video + prompt_kv


def _image_tokens(instance: ModelInstance) -> int:
    """CLIP image tokens one request's cross-attention reads (I2V checkpoints; 0 without a CLIP encoder): the DiT's
    position table's length where it joins two images (first-last-frame), else one image's 1 + patches."""
    encoder = instance.components.get("image_encoder")
    if encoder is None:
        return 0
    dit = instance["transformer"].config
    if dit.pos_embed_seq_len is not None:
        return dit.pos_embed_seq_len
    clip = encoder.model.config
    return (clip.image_size // clip.patch_size) ** 2 + 1
