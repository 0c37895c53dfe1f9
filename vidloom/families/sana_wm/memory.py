"""Estimated peak memory of one SANA-WM request beyond the resident weights (ModelCard.memory_estimator).

The denoise term is the larger of a GDN block and a softmax block over the whole clip (CFG runs a batch of
two): hidden activations (core.footprint copy counts, the GLU FFN twice as wide as its hidden), the
delta rule's float32 per-frame D x D transitions and states (both directions, main, mass and camera
streams), the UCPE ray matrices, and for softmax blocks the score matrix SDPA may materialise. The
LTX-2 VAE decodes the whole clip in one pass (as the LTX-2 estimate counts it). With the refiner
(--two-stage), its sink + sliding-window KV slab is held for the whole rollout (persistent) and one
refiner block over a chunk attending to the window runs after stage 1 (within the denoise term's max). Under --sp
a rank whose refiner shards (refiner_parallel.py) holds heads/K of every window token and 1/K of the chunk's rows.
"""

from __future__ import annotations

from vidloom.core.footprint import Footprint, block_bytes, decode_bytes, element_size, latent_bytes, video_bytes
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate
from vidloom.core.request import GenerationRequest
from vidloom.families.sana_wm.refiner_parallel import refiner_layout
from vidloom.families.sana_wm.text import MAX_TEXT_TOKENS
from vidloom.layers.prompt_kv import prompt_kv_bytes

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
    denoise = hidden + max(delta_rule, scores) + rays
    # The text's prompt K/V, both CFG rows, prepared once for the request (diffusion.prompt_kv).
    # The card's prompt length, not the encoder's: a rank without it (--text-encoder-rank) estimates alike.
    tokens_text = instance.card.max_prompt_tokens or MAX_TEXT_TOKENS
    persistent += prompt_kv_bytes(dit.num_layers, tokens_text, dim, act) * batch
    if "refiner" in instance.components:
        persistent += latent_bytes(dit.in_channels, tokens)  # the refined copy beside stage 1's latents
        persistent += _refiner_window(instance, frames, h * dit.patch_size[1], w * dit.patch_size[2])
        denoise = max(denoise, _refiner_step(instance, frames, h * w, act))
    return Footprint(denoise=denoise, decode=decode, persistent=persistent)


def _refiner_window(instance: ModelInstance, frames: int, h: int, w: int) -> int:
    from vidloom.families.sana_wm.refine_loop import SanaWMRefineLoop

    loop = SanaWMRefineLoop(instance["refiner"], instance.dtype, instance["refiner_settings"],
                            shards=refiner_layout(instance))
    return loop.window_bytes(1, frames, h, w)


def _refiner_step(instance: ModelInstance, frames: int, per_frame: int, act: int) -> int:
    """One refiner block over a chunk: hidden activations plus the chunk x window score matrix (under --sp this
    rank's rows, and its heads' scores)."""
    c, s = instance["refiner"].config, instance["refiner_settings"]
    split = refiner_layout(instance).size
    chunk = min(s.block_size, frames) * per_frame
    window = min(s.kv_max_frames if s.kv_max_frames > 0 else frames, frames) * per_frame + chunk
    rows = -(-chunk // split)
    return block_bytes(1, rows, c.dim, 4 * c.dim, act) + c.num_attention_heads // split * chunk * window * act
