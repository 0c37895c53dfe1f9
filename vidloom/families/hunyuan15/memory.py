"""Estimated peak memory of one HunyuanVideo-1.5 request beyond the resident weights (ModelCard.memory_estimator).

Each block attends jointly over the video's latent cells (1x1 patches) and the condition tokens: the refined prompt
(at most MAX_PROMPT_TOKENS), the ByT5 glyph text (MAX_GLYPH_TOKENS), each rounded up to its prompt-length bucket under
cuda_graphs (runtime.prompt_buckets: the padded rows run through every block), and, for image to video, SigLIP's
tokens. The guider runs the two CFG branches one after the other (cfg_mode is refused), so guidance adds no width.
The VAE decodes the whole clip in one pass (spatially tiled with vae_tile) through its widest full-resolution
channels.
Copy counts: core.footprint.
"""

from __future__ import annotations

from vidloom.core.footprint import (
    VAE_COPIES, Footprint, block_bytes, decode_bytes, decode_pixels, element_size, latent_bytes, part_estimator,
    video_bytes,
)
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.core.request import GenerationRequest
from vidloom.families.hunyuan15.text import MAX_GLYPH_TOKENS, MAX_PROMPT_TOKENS
from vidloom.runtime.prompt_buckets import bucket_length

SIGLIP_TOKENS = 729  # the released image encoder: SigLIP at 384 px in 14 px patches (27 x 27)
# The one-pass decode measured about 8 live float32 copies per full-resolution channel, pixel and frame on the tiny
# checkpoint (peak RSS from 256x256 to 512x512 at 17 frames, test_memory_estimates); 20 keeps it bounded with room.
# CUDA keeps the shared count (not calibrated on a GPU).
HUNYUAN15_VAE_COPIES = {**VAE_COPIES, "cpu": 20}


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The estimator for `instance`; None if it holds no HunyuanVideo-1.5 transformer and VAE."""
    return part_estimator(instance, footprint)


def footprint(instance: ModelInstance, request: GenerationRequest) -> Footprint:
    """`request` (resolved) on `instance`, part by part."""
    assert request.height and request.width and request.num_frames, "resolve the request first"
    dit = instance["transformer"].config
    vae = instance["vae"].config
    latent_frames = (request.num_frames - 1) // vae.temporal_factor + 1
    cells = latent_frames * (request.height // vae.spatial_factor) * (request.width // vae.spatial_factor)
    rows = bucket_length if instance.deploy.cuda_graphs else int  # int: the unpadded prompts' own counts
    condition = rows(MAX_PROMPT_TOKENS) + rows(MAX_GLYPH_TOKENS) + (SIGLIP_TOKENS if request.image else 0)
    denoise = block_bytes(1, cells + condition, dit.dim, int(dit.mlp_ratio * dit.dim), element_size(instance.dtype))
    pixels = decode_pixels(request.height, request.width, instance.deploy.vae_tile)
    decode = decode_bytes(instance.device, vae.block_out_channels[0], pixels, request.num_frames, HUNYUAN15_VAE_COPIES)
    persistent = latent_bytes(dit.in_channels, cells) + video_bytes(request.num_frames, request.height, request.width)
    return Footprint(denoise=denoise, decode=decode, persistent=persistent)
