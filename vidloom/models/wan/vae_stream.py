"""Chunk-by-chunk Wan VAE decoding: latents arrive in pieces, frames leave as soon as each piece is in.

The decoder is causal in time and already runs one latent frame at a time; decoding
a chunk is the same per-frame walk with the causal state carried over from the
previous chunk, so the frames equal decoding the whole latent at once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vidloom.layers.memory_format import channels_last
from vidloom.models.wan.vae import WanVAE
from vidloom.models.wan.vae_blocks import CausalCache


class StreamingDecode:
    """One video's decode, fed latent chunks in order; holds that video's causal state only."""

    def __init__(self, vae: WanVAE) -> None:
        self.vae = vae
        self._cache = CausalCache()
        self.latent_frames = 0
        """Latent frames decoded so far."""

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """The next raw latent frames [B, z, T, h, w] -> their video frames [B, 3, F, H, W] in [-1, 1].

        The first latent frame of the video yields 1 frame, every later one `temporal_factor` frames.
        """
        z_dim = self.vae.config.z_dim
        if latents.ndim != 5 or latents.shape[1] != z_dim:
            raise ValueError(f"latents must be [B, {z_dim}, T, h, w]; got shape {tuple(latents.shape)}")
        x = self.vae.post_quant_conv(channels_last(latents))  # 1x1x1: no state across frames
        frames = []
        for index in range(x.shape[2]):
            self._cache.begin_chunk()
            frames.append(self.vae.decoder(x[:, :, index : index + 1], self._cache))
        self.latent_frames += x.shape[2]
        return torch.cat(frames, dim=2).clamp(-1.0, 1.0)
