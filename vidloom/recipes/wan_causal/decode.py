"""Decoding a causal rollout chunk by chunk, so each chunk's frames exist as soon as the chunk does."""

from __future__ import annotations

from torch import Tensor

from vidloom.models.wan.vae import WanVAE
from vidloom.models.wan.vae_stream import StreamingDecode


def video_frame_range(latent_start: int, latent_stop: int, temporal_factor: int) -> tuple[int, int]:
    """Video frames [start, stop) that latent frames [latent_start, latent_stop) decode to (the first gives one)."""

    def frames(latents: int) -> int:
        return 0 if latents == 0 else 1 + (latents - 1) * temporal_factor

    return frames(latent_start), frames(latent_stop)


def decode_chunk(vae: WanVAE, stream: StreamingDecode, latents: Tensor) -> Tensor:
    """Normalised latents [1, C, T, h, w] of the next chunk -> frames [F, H, W, 3] in [0, 1], float32 on CPU.

    The same arithmetic as a whole-video decode (denormalise, decode, x/2 + 1/2, clamp),
    so the chunks concatenated are the whole video's frames.
    """
    vae_dtype = next(vae.parameters()).dtype
    video = stream.decode(vae.denormalize_latents(latents.to(vae_dtype)))
    return (video[0].float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).cpu()
