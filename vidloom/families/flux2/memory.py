"""Estimated peak memory of one Flux2 Klein request beyond the resident weights (ModelCard.memory_estimator).

The transformer attends jointly over the target's tokens, every reference image's tokens and the padded
text, so references raise the denoise term as much as a larger image; the VAE decodes one image at
full resolution through its widest full-resolution channels. Copy counts: core.footprint.
"""

from __future__ import annotations

from vidloom.core.footprint import (
    VAE_COPIES, Footprint, block_bytes, decode_bytes, element_size, latent_bytes, video_bytes,
)
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.core.request import GenerationRequest
from vidloom.families.flux2.program import MAX_REFERENCE_AREA
from vidloom.families.flux2.text import FLUX2_TEXT_TOKENS

# SwiGLU: the FFN holds its gate and up projections ([tokens, mlp_dim] each) beside the product.
SWIGLU_FACTOR = 3


# The 2D VAE decodes channels-last with no causal cache: a whole 512x512 request on the tiny checkpoint measured
# 64 MiB of peak RSS (test_memory_estimates), later 31.6-31.9 MiB, well under the 40 copies of the 3D Wan VAE; 20
# bounds both within the test's factor (24 put the estimate 10 MiB past 6x the lower reading). CUDA keeps the shared
# count (not calibrated on a GPU).
FLUX2_VAE_COPIES = {**VAE_COPIES, "cpu": 20}


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The estimator for `instance`; None if it holds no Flux2 transformer and VAE."""
    if not {"transformer", "vae"} <= instance.components.keys():
        return None
    return lambda request: footprint(instance, request).total


def footprint(instance: ModelInstance, request: GenerationRequest) -> Footprint:
    """`request` (resolved) on `instance`, part by part."""
    assert request.height and request.width, "resolve the request first"
    dit = instance["transformer"].config
    multiple = instance.card.geometry.spatial_multiple
    cells = (request.height // multiple) * (request.width // multiple)
    references = sum(_reference_pixels(image) // (multiple * multiple) for image in request.image or ())
    distilled = bool(instance.components.get("distilled"))
    cfg = request.uses_cfg and not distilled
    batch = 2 if cfg and instance.deploy.cfg_mode == "batched" else 1
    tokens = cells + references + FLUX2_TEXT_TOKENS
    denoise = block_bytes(batch, tokens, dit.dim, SWIGLU_FACTOR * dit.mlp_dim, element_size(instance.dtype))
    vae = instance["vae"].config
    channels = (vae.decoder_block_out_channels or vae.block_out_channels)[0]
    pixels = request.height * request.width
    decode = decode_bytes(instance.device, channels, pixels, 1, FLUX2_VAE_COPIES)
    persistent = latent_bytes(dit.in_channels, cells + references) + video_bytes(1, request.height, request.width)
    return Footprint(denoise=denoise, decode=decode, persistent=persistent)


def _reference_pixels(image: object) -> int:
    """Pixels a reference image takes once shrunk to the pipeline's 1 MP (MAX_REFERENCE_AREA) at most."""
    size = getattr(image, "size", None)
    if not (isinstance(size, tuple) and len(size) == 2):
        return MAX_REFERENCE_AREA
    return min(int(size[0]) * int(size[1]), MAX_REFERENCE_AREA)
