"""Helios' conditioning on media (HeliosPipeline I2V and V2V), drawn from the request's generator in the pipeline's
order before any chunk's noise; the VAE posterior is sampled (not its mean), as the pipeline does.

Image: the first frame's latents are every chunk's short-history prefix and a 33-frame still of it gives the newest
history frame, both noised a little. Video: the first frame is the prefix, and the last floor(F / 33) * 33 frames,
encoded 33 at a time and noised per latent frame, are the history the new chunks continue. An extension (extend_from)
is the video case on the source's own latents (the pipeline's `image_latents` and `video_latents`): nothing is
re-encoded, so the generator's first draws are the noise's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vidloom.core.errors import InvalidRequest
from vidloom.media.image import fit_image
from vidloom.models.wan.vae import WanVAE

# HeliosPipeline's defaults: the image latents are noised with sigma ~ U(0.111, 0.135), as is the still's last frame.
NOISE_SIGMA_MIN, NOISE_SIGMA_MAX = 0.111, 0.135


@dataclass(frozen=True)
class MediaConditioning:
    """Normalised latents: the prefix [1, C, 1, h, w] of every chunk's short history, and the newest history frames
    [1, C, T, h, w] (the oldest first)."""

    prefix: Tensor
    history: Tensor


def pixels(frames: list[Image.Image], width: int, height: int) -> Tensor:
    """Frames resized (Lanczos) to the video's size as [1, 3, F, H, W] in [-1, 1], float32."""
    arrays = [np.asarray(fit_image(f.convert("RGB"), (width, height)), dtype=np.float32) / 255.0 for f in frames]
    return torch.from_numpy(np.stack(arrays)).permute(3, 0, 1, 2)[None] * 2.0 - 1.0


def _sigma(generator: torch.Generator, count: int) -> Tensor:
    return torch.rand(count, generator=generator) * (NOISE_SIGMA_MAX - NOISE_SIGMA_MIN) + NOISE_SIGMA_MIN


def _noised(latents: Tensor, sigma: Tensor, generator: torch.Generator) -> Tensor:
    return sigma * torch.randn(latents.shape, generator=generator) + (1 - sigma) * latents


def _sample(vae: WanVAE, video: Tensor, generator: torch.Generator) -> Tensor:
    """Normalised posterior sample of `video` [1, 3, F, H, W] (on the VAE's device and dtype), float32 on the CPU."""
    with torch.inference_mode():
        return vae.normalize_latents(vae.encode(video).sample(generator).float()).cpu()


def encode_first_frame(vae: WanVAE, image: Tensor, chunk_frames: int, generator: torch.Generator,
                       device: torch.device) -> MediaConditioning:
    """`image` [1, 3, 1, H, W] -> the prefix and one history frame."""
    frame = image.to(device, next(vae.parameters()).dtype)
    prefix = _sample(vae, frame, generator)
    last = _sample(vae, frame.repeat(1, 1, chunk_frames, 1, 1), generator)[:, :, -1:]
    prefix = _noised(prefix, _sigma(generator, 1), generator)
    return MediaConditioning(prefix.to(device), _noised(last, _sigma(generator, 1), generator).to(device))


def encode_context_video(vae: WanVAE, video: Tensor, chunk_frames: int, generator: torch.Generator,
                         device: torch.device) -> MediaConditioning:
    """`video` [1, 3, F, H, W] (F >= chunk_frames) -> the prefix and the history of its last whole chunks."""
    frames = video.shape[2]
    chunks = frames // chunk_frames
    if chunks == 0:
        raise InvalidRequest("video", f"has {frames} frames; Helios continues a clip of at least {chunk_frames}")
    video = video.to(device, next(vae.parameters()).dtype)
    start = frames - chunks * chunk_frames  # the pipeline keeps the last whole chunks
    prefix = _sample(vae, video[:, :, :1], generator)
    parts = [_sample(vae, video[:, :, start + i * chunk_frames: start + (i + 1) * chunk_frames], generator)
             for i in range(chunks)]
    return noised_context(prefix, parts, generator, device)


def continue_latents(latents: Tensor, chunk_latent_frames: int, generator: torch.Generator,
                     device: torch.device) -> MediaConditioning:
    """A finished video's normalised latents [1, C, k * chunk_latent_frames, h, w] -> the prefix (its first latent
    frame) and its chunks as history, noised as a clip's (HeliosPipeline given image_latents and video_latents)."""
    latents = latents.float().cpu()
    parts = list(latents.split(chunk_latent_frames, dim=2))
    return noised_context(latents[:, :, :1], parts, generator, device)


def noised_context(prefix: Tensor, parts: list[Tensor], generator: torch.Generator,
                   device: torch.device) -> MediaConditioning:
    """The prefix noised, then each chunk's latents noised per latent frame, in the pipeline's draw order."""
    prefix = _noised(prefix, _sigma(generator, 1), generator)
    noised = []
    for part in parts:  # each latent frame gets its own sigma
        noised.append(_noised(part, _sigma(generator, part.shape[2]).view(1, 1, -1, 1, 1), generator))
    return MediaConditioning(prefix.to(device), torch.cat(noised, dim=2).to(device))
