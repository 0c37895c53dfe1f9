"""Decoding a causal rollout chunk by chunk, so each chunk's frames exist as soon as the chunk does.

With the deployment's `vae_tile`, each chunk decodes in spatial tiles (the shared rule, vidloom.layers.tiling):
every tile keeps its own causal state across the chunks (the Wan decoder's time convolutions read the previous
frames' tails, and a tile's tails are its own pixels), and the seams are blended per frame. So the chunks
concatenated are exactly the whole video's tiled decode (`WanVAE.decode(tiling=...)`), as the untiled chunks
are its plain decode.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from vidloom.layers.memory_format import channels_last
from vidloom.layers.tiling import SpatialTiling, decode_tiles_2d
from vidloom.models.wan.vae import WanVAE
from vidloom.models.wan.vae_blocks import CausalCache
from vidloom.models.wan.vae_stream import StreamingDecode


class ChunkDecoder(Protocol):
    latent_frames: int

    def decode(self, latents: Tensor) -> Tensor: ...


class TiledStreamingDecode:
    """One video's decode in spatial tiles, fed latent chunks in order; one causal state per tile."""

    def __init__(self, vae: WanVAE, tiling: SpatialTiling) -> None:
        if vae.config.patch_size:
            raise ValueError("tiled streaming decode is written for the unpatched (Wan2.1) VAE")
        self.vae, self.tiling = vae, tiling
        self._caches: list[CausalCache] = []  # in the tile grid's raster order, the same for every chunk
        self._size: tuple[int, int] | None = None
        self.latent_frames = 0
        """Latent frames decoded so far."""

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """The next raw latent frames [B, z, T, h, w] -> their video frames [B, 3, F, H, W] in [-1, 1]."""
        z_dim = self.vae.config.z_dim
        if latents.ndim != 5 or latents.shape[1] != z_dim:
            raise ValueError(f"latents must be [B, {z_dim}, T, h, w]; got shape {tuple(latents.shape)}")
        size = (latents.shape[3], latents.shape[4])
        if self._size not in (None, size):
            raise ValueError(f"chunk latents are {size[0]}x{size[1]}, earlier chunks {self._size[0]}x{self._size[1]}")
        self._size = size
        x = self.vae.post_quant_conv(channels_last(latents))  # 1x1x1: no state across frames or tiles
        visited = 0

        def tile_frames(tile: Tensor) -> Tensor:
            nonlocal visited
            if visited == len(self._caches):
                self._caches.append(CausalCache())
            cache = self._caches[visited]
            visited += 1
            frames = []
            for index in range(tile.shape[2]):
                cache.begin_chunk()
                frames.append(self.vae.decoder(tile[:, :, index : index + 1], cache))
            return torch.cat(frames, dim=2)

        video = decode_tiles_2d(x, tile_frames, self.tiling, self.vae.config.spatial_factor)
        self.latent_frames += x.shape[2]
        return video.clamp(-1.0, 1.0)


def new_stream(vae: WanVAE, tiling: SpatialTiling | None) -> ChunkDecoder:
    """The chunk decoder for one video: tiled when the deployment sets `vae_tile`."""
    return StreamingDecode(vae) if tiling is None else TiledStreamingDecode(vae, tiling)


def video_frame_range(latent_start: int, latent_stop: int, temporal_factor: int) -> tuple[int, int]:
    """Video frames [start, stop) that latent frames [latent_start, latent_stop) decode to (the first gives one)."""

    def frames(latents: int) -> int:
        return 0 if latents == 0 else 1 + (latents - 1) * temporal_factor

    return frames(latent_start), frames(latent_stop)


def decode_chunk(vae: WanVAE, stream: ChunkDecoder, latents: Tensor) -> Tensor:
    """Normalised latents [1, C, T, h, w] of the next chunk -> frames [F, H, W, 3] in [0, 1], float32 on CPU.

    The same arithmetic as a whole-video decode (denormalise, decode, x/2 + 1/2, clamp),
    so the chunks concatenated are the whole video's frames.
    """
    vae_dtype = next(vae.parameters()).dtype
    video = stream.decode(vae.denormalize_latents(latents.to(vae_dtype)))
    return (video[0].float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).cpu()
