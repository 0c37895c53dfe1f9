"""Footprint: a request's estimated peak memory beyond the resident weights, by part, with the arithmetic
every family's estimator (ModelCard.memory_estimator) shares.

A request's memory has four parts. Caches (KV slabs, an AR reasoner's keys and values, a session copy)
and the persistent tensors (latents, sampler history, decoded frames and sound) live through the run;
the transient peak is the larger of one transformer block's activations at the longest forward and
one decode pass, as the two never overlap. The copy counts were calibrated against peak RSS of tiny
and demo models on CPU in float32 (tests/integration/test_memory_estimates.py measures every family)
and rounded up: an estimate refuses what cannot fit, it does not pack memory tightly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from vidloom.core.limits import MemoryEstimate

# Live [tokens, inner_dim] tensors in one block (input, norm, q, k, v, attention out, residual,
# modulation, RoPE'd q/k) and live [tokens, ffn_dim] tensors (the FFN's hidden and its activation).
HIDDEN_COPIES = 12
FFN_COPIES = 2
# Live float32 values per (channel at full resolution x output pixel x decoded frame) during a decode:
# conv inputs and outputs, norms, upsampled activations and allocator slack. CPU: calibrated (glibc keeps
# freed blocks, so RSS peaks high); 20 held for multi-frame Wan chunks, but in a fresh process
# (test_memory_estimates) a one-frame Wan decode measured 28 and a Wan I2V request (its conditioning clip
# encoded, then decoded) 36, hence 40. CUDA: the caching allocator reuses freed blocks exactly; 8 is a
# conservative count of the live tensors, not yet calibrated on a GPU.
VAE_COPIES = {"cpu": 40, "cuda": 8}
# The Wan VAE (Wan2.1/2.2, AnyFlow-FAR, Cosmos3, Helios, Qwen-Image's) runs its float32 CPU convs on oneDNN whatever
# their size (layers.onednn_conv: no im2col column buffers), its causal convs read one stream buffer the norm writes
# into, drop the time taps a lone frame's zero padding would take, and store no tails on a call's last chunk
# (models.wan.vae_causal), and its upsample + conv runs on the low-resolution frames (layers.upsample_conv). With
# those, test_memory_estimates measured every Wan-VAE case, one-frame (512x512 image) and multi-frame alike, at or
# below a count of 8 on CPU, but with wide swings between runs of the same request (the Wan one-frame case 101-179
# MiB against 263 estimated at 8; Helios 131-153 against 259; FAR 21-32 against 201), hence 12. CUDA: VAE_COPIES'
# uncalibrated 8.
WAN_VAE_COPIES = {"cpu": 12, "cuda": 8}


def wan_vae_copies(device: torch.device | None) -> int:
    """Live full-resolution copies of a Wan VAE decode pass (see WAN_VAE_COPIES)."""
    device_type = getattr(device, "type", "cpu")
    return WAN_VAE_COPIES.get(device_type, WAN_VAE_COPIES["cpu"])


# Latents, noise predictions, sampler history and the step cache's residuals, in float32.
LATENT_COPIES = 8
# Text-encoder pass, thread pools, allocator granularity: paid by every request.
FIXED_OVERHEAD = 128 << 20


@dataclass(frozen=True)
class Footprint:
    """Estimated peak bytes of one request beyond the resident weights, by part."""

    caches: int = 0  # held through the run: KV slabs, a reasoner's keys/values, a session copy
    denoise: int = 0  # one transformer block's live activations at the longest forward
    decode: int = 0  # one decode pass (VAE, audio VAE + vocoder)
    persistent: int = 0  # latents, sampler history, decoded frames and sound, held to the end
    fixed: int = FIXED_OVERHEAD

    @property
    def total(self) -> int:
        return self.fixed + self.caches + max(self.denoise, self.decode) + self.persistent


def part_estimator(instance: Any, footprint: Callable[[Any, Any], Footprint],
                   needs: tuple[str, ...] = ("transformer", "vae")) -> MemoryEstimate | None:
    """A card's estimator from a family's `footprint(instance, request)`: its total per request; None when
    `instance` holds not all of `needs`."""
    if not set(needs) <= instance.components.keys():
        return None
    return lambda request: footprint(instance, request).total


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def block_bytes(batch: int, tokens: int, inner_dim: int, ffn_dim: int, act: int) -> int:
    """Live activations of one transformer block over `tokens` tokens of width `inner_dim`."""
    return batch * tokens * (HIDDEN_COPIES * inner_dim + FFN_COPIES * ffn_dim) * act


def decode_bytes(device: torch.device | None, channels: int, pixels: int, frames: int,
                 copies: Mapping[str, int] | int = VAE_COPIES) -> int:
    """One decode pass producing `frames` frames of `pixels` pixels through `channels` full-resolution channels;
    `copies`: live full-resolution tensors per device type (a family's own count where it was measured), or the
    count itself."""
    if not isinstance(copies, int):
        copies = copies.get(getattr(device, "type", "cpu"), copies["cpu"])
    return copies * channels * pixels * frames * 4


def decode_pixels(height: int, width: int, tile: int | None) -> int:
    """Output pixels one decode pass works on at full resolution: the frame's, or with the deployment's `vae_tile`
    one tile's, as each tile decodes alone and blends into the output before the next decodes (vidloom.layers.tiling).
    What a tiled decode keeps besides (one row of `tile - stride` overlap strips: under a third of the output at the
    default 3/4 stride) is left to the copy counts' rounding, not charged."""
    pixels = height * width
    return pixels if tile is None else min(pixels, tile * tile)


def causal_decode_frames(latent_frames: int, temporal_factor: int) -> int:
    """Frames one pass of a causal video VAE (Wan's) holds: each latent frame decodes to `temporal_factor` frames
    (the first to one) and its causal caches keep two more."""
    return 1 if latent_frames == 1 else temporal_factor + 2


def video_bytes(frames: int, height: int, width: int) -> int:
    """Decoded frames in float32 plus their uint8 copy."""
    return frames * height * width * 3 * (4 + 1)


def latent_bytes(channels: int, cells: int) -> int:
    """Latents and the sampler's float32 history over `cells` latent positions of `channels` channels."""
    return LATENT_COPIES * channels * cells * 4


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in `value` (a tensor, None, or tuples/lists/dicts of them; anything else holds none): what
    a captured graph's outputs or a stacked copy's rows hold, measured rather than estimated."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    return 0
