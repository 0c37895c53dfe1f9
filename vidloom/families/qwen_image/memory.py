"""Estimated peak memory of one Qwen-Image request beyond the resident weights (ModelCard.memory_estimator).

The dual-stream transformer attends jointly over the prompt's tokens (at most MAX_PROMPT_TOKENS), the target's
and, when editing, each reference's (resized to about EDIT_AREA pixels); its residual stream is float32. True CFG
runs the two branches one after the other, unless cfg_mode is "batched" (one forward of two); under zero_cond_t an
edit's image modulations are per token. The (Wan 2.1) VAE decodes one frame through its widest full-resolution
channels. Copy counts: core.footprint.
"""

from __future__ import annotations

from vidloom.core.footprint import (
    Footprint, block_bytes, decode_bytes, decode_pixels, element_size, latent_bytes, part_estimator, video_bytes,
    wan_vae_copies,
)
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.core.request import GenerationRequest
from vidloom.families.qwen_image.program import EDIT_AREA, uses_true_cfg
from vidloom.families.qwen_image.text import MAX_PROMPT_TOKENS

MLP_RATIO = 4  # blocks.GeluMLP: dim -> 4 dim -> dim


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The estimator for `instance`; None if it holds no Qwen-Image transformer and VAE."""
    return part_estimator(instance, footprint)


def footprint(instance: ModelInstance, request: GenerationRequest) -> Footprint:
    """`request` (resolved) on `instance`, part by part."""
    assert request.height and request.width, "resolve the request first"
    dit = instance["transformer"].config
    multiple = instance.card.geometry.spatial_multiple
    cells = (request.height // multiple) * (request.width // multiple)
    references = len(request.image or ()) * (EDIT_AREA // (multiple * multiple))
    tokens = cells + references + MAX_PROMPT_TOKENS
    act = max(element_size(instance.dtype), 4)  # the joint stream is float32 whatever the compute dtype
    batch = 2 if uses_true_cfg(request) and instance.deploy.cfg_mode == "batched" else 1
    denoise = block_bytes(batch, tokens, dit.dim, MLP_RATIO * dit.dim, act)
    if dit.zero_cond_t and references:  # blocks.ImageModulation: six float32 modulations per image token
        denoise += batch * (cells + references) * 6 * dit.dim * 4
    vae = instance["vae"].config
    pixels = decode_pixels(request.height, request.width, instance.deploy.vae_tile)
    decode = decode_bytes(instance.device, vae.decoder_dim, pixels, 1, wan_vae_copies(instance.device))
    persistent = latent_bytes(dit.in_channels, cells + references) + video_bytes(1, request.height, request.width)
    return Footprint(denoise=denoise, decode=decode, persistent=persistent)
