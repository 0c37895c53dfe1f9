"""Estimated peak memory of one SANA-WM request beyond the resident weights (ModelCard.memory_estimator).

The denoise term is the larger of a GDN block and a softmax block over the whole clip (CFG runs a batch of
two): hidden activations (core.footprint copy counts, the GLU FFN twice as wide as its hidden), the
delta rule's float32 per-frame D x D transitions and states (both directions, main, mass and camera
streams), the UCPE ray matrices, and for softmax blocks the score matrix SDPA may materialise. The
LTX-2 VAE decodes the whole clip in one pass (as the LTX-2 estimate counts it).
"""

from __future__ import annotations

from vidloom.core.footprint import Footprint, block_bytes, decode_bytes, element_size, latent_bytes, video_bytes
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.core.request import GenerationRequest

DELTA_RULE_COPIES = 8  # transitions + inputs + states, forward and backward, of the widest stream at once
RAY_MATRIX_COPIES = 4  # P, P^T, P^-1 and the per-ray build, 4x4 float per token


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    if not {"transformer", "vae"} <= instance.components.keys():
        return None
    return lambda request: footprint(instance, request).total


def footprint(instance: ModelInstance, request: GenerationRequest) -> Footprint:
    assert request.height and request.width and request.num_frames, "resolve the request first"
    dit, vae = instance["transformer"].config, instance["vae"]
    frames = (request.num_frames - 1) // vae.temporal_compression_ratio + 1
    h = request.height // (vae.spatial_compression_ratio * dit.patch_size[1])
    w = request.width // (vae.spatial_compression_ratio * dit.patch_size[2])
    tokens = frames * h * w
    batch = 2 if request.uses_cfg else 1
    act = element_size(instance.dtype)
    dim = dit.hidden_size
    hidden = block_bytes(batch, tokens, dim, 2 * int(dim * dit.mlp_ratio), act)
    heads, head_dim = dit.self_attn_heads, dit.head_dim
    delta_rule = DELTA_RULE_COPIES * batch * heads * frames * head_dim * head_dim * 4
    scores = batch * heads * tokens * tokens * 2 if dit.softmax_every_n > 0 else 0
    rays = RAY_MATRIX_COPIES * batch * tokens * 16 * 4
    per_pixel = max(1, vae.config.decoder_block_out_channels[0] // vae.config.patch_size ** 2)
    decode = decode_bytes(instance.device, per_pixel, request.height * request.width, request.num_frames)
    persistent = latent_bytes(dit.in_channels, tokens) + video_bytes(request.num_frames, request.height, request.width)
    return Footprint(denoise=hidden + max(delta_rule, scores) + rays, decode=decode, persistent=persistent)
