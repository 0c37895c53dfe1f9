"""Estimated peak memory of one AnyFlow-FAR request beyond the resident weights (ModelCard.memory_estimator).

What lives through the whole rollout is known exactly: the KV slab (sized for the
longest chunk sequence) and the per-layer text keys/values. On top of it the peak is
the larger of one block's activations over the longest forward (a prefill of the
whole context, or a chunk step) and the VAE decode, which measured as growing with every
frame of the clip. The copy counts are Wan2.1's (core.footprint: same blocks, same VAE).
The estimate refuses what cannot fit, it does not pack.
"""

from __future__ import annotations

from functools import partial

import torch

from vidloom.core.footprint import FFN_COPIES, FIXED_OVERHEAD, HIDDEN_COPIES, LATENT_COPIES, wan_vae_copies
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.core.request import GenerationRequest
from vidloom.families.wan_causal.kv_cache import FarKVCache
from vidloom.families.wan_causal.layout import ChunkLayout
from vidloom.families.wan_causal.loop import rollout_partition

TEXT_TOKENS = 512  # the Wan text encoder's padded length


def request_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The estimator for `instance`; None if it holds no FAR transformer and VAE."""
    if not {"transformer", "vae"} <= instance.components.keys():
        return None
    return partial(estimate_request_bytes, instance)


def rollout_layouts(instance: ModelInstance, request: GenerationRequest) -> list[ChunkLayout]:
    """The chunk layouts the rollout of `request` (resolved) will use."""
    config = instance["transformer"].config
    vae = instance["vae"].config
    latent_frames = vae.latent_frames(request.num_frames)
    hw = (request.height // vae.spatial_factor, request.width // vae.spatial_factor)
    partition = rollout_partition(request, latent_frames, config.chunk_partition)
    return [ChunkLayout.for_chunk(partition, k, hw, config) for k in range(len(partition))]


def kv_cache_bytes(instance: ModelInstance, request: GenerationRequest) -> int:
    """Exactly what the rollout's KV slab takes (the bytes the cache manager accounts)."""
    wan = instance["transformer"].config.wan
    branches = 2 if request.uses_cfg else 1
    return FarKVCache.bytes_needed(rollout_layouts(instance, request), wan.num_layers, branches,
                                   wan.num_attention_heads, wan.attention_head_dim, instance.dtype)


def session_bytes(instance: ModelInstance, request: GenerationRequest) -> int:
    """The compact KV copy a finished rollout leaves as a session (0 when the deployment keeps none).

    It is taken while the slab is still held, so it adds to the request's peak.
    """
    if instance.deploy.kv_session_ttl_s <= 0:
        return 0
    config = instance["transformer"].config
    wan, vae = config.wan, instance["vae"].config
    chunks = rollout_layouts(instance, request)[-1].chunks
    hw = (request.height // vae.spatial_factor, request.width // vae.spatial_factor)
    following = ChunkLayout.for_chunk((*chunks, chunks[-1]), len(chunks), hw, config)
    branches = 2 if request.uses_cfg else 1
    act = torch.empty((), dtype=instance.dtype).element_size()
    return 2 * wan.num_layers * branches * following.context_tokens * wan.num_attention_heads * wan.attention_head_dim * act


def estimate_request_bytes(instance: ModelInstance, request: GenerationRequest) -> int:
    """Bytes `request` (resolved) needs on `instance`'s device while it runs."""
    assert request.height and request.width and request.num_frames, "resolve the request first"
    wan = instance["transformer"].config.wan
    vae = instance["vae"].config
    act = torch.empty((), dtype=instance.dtype).element_size()
    branches = 2 if request.uses_cfg else 1
    layouts = rollout_layouts(instance, request)
    # The longest forward: a prefill over the whole context, or a step over its chunk.
    tokens = max(max(layout.context_tokens, layout.generated_tokens) for layout in layouts)
    forward = branches * tokens * (HIDDEN_COPIES * wan.inner_dim + FFN_COPIES * wan.ffn_dim) * act
    text = 2 * wan.num_layers * branches * TEXT_TOKENS * wan.inner_dim * act

    pixels = request.height * request.width
    copies = wan_vae_copies(instance.device)
    # Measured (tests/integration/test_memory_estimates.py): a rollout's peak grows with the whole clip's
    # frames, about that many floats per base channel, pixel and frame, unlike Wan's one latent frame at a
    # time; so every frame counts here until the rollout's decode holds less.
    decode = copies * vae.decoder_dim * pixels * request.num_frames * 4

    latent_frames = sum(layouts[-1].chunks)
    latents = LATENT_COPIES * wan.in_channels * latent_frames * (request.height // vae.spatial_factor) * (
        request.width // vae.spatial_factor) * 4
    video = request.num_frames * pixels * 3 * (4 + 1)  # float32 frames (per chunk, kept) + uint8 copy
    kv = kv_cache_bytes(instance, request) + session_bytes(instance, request)
    return FIXED_OVERHEAD + kv + text + max(forward, decode) + latents + video
