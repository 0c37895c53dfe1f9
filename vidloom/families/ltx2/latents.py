"""LTX-2 latent layout: packing video/audio latents into tokens, their sizes, positions and initial noise.

The packing orders and the noise draws follow LTX2Pipeline (_pack_latents, _pack_audio_latents,
prepare_latents, prepare_audio_latents, _create_noised_state) so the same seed gives the same video.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vidloom.models.ltx2.audio_vae import LTX2AudioVAE
from vidloom.models.ltx2.patches import pack_video, unpack_video
from vidloom.models.ltx2.rope import audio_positions, video_positions
from vidloom.models.ltx2.transformer import LTX2Positions, LTX2TransformerConfig
from vidloom.models.ltx2.video_vae import LTX2VideoVAE
from vidloom.families.ltx2.loop import LTX2Layout


def pack_audio(latents: Tensor) -> Tensor:
    """[B, C, L, M] -> [B, L, C * M] (every mel bin of a latent frame is one token)."""
    return latents.transpose(1, 2).flatten(2, 3)


def unpack_audio(tokens: Tensor, mel_bins: int) -> Tensor:
    return tokens.unflatten(2, (-1, mel_bins)).transpose(1, 2)


@dataclass(frozen=True)
class LTX2Geometry:
    """Everything that turns a request's size and duration into latent shapes and positions."""

    dit: LTX2TransformerConfig
    spatial: int  # VAE pixels per latent cell
    temporal: int  # VAE frames per latent frame (after the first)
    video_channels: int
    audio_channels: int  # audio VAE latent channels
    audio_mel_bins: int  # latent mel bins
    audio_per_second: float  # audio latent frames per second of sound

    @classmethod
    def of(cls, dit: LTX2TransformerConfig, vae: LTX2VideoVAE, audio_vae: LTX2AudioVAE) -> LTX2Geometry:
        return cls(dit, vae.spatial_compression_ratio, vae.temporal_compression_ratio, dit.in_channels,
                   audio_vae.config.latent_channels, audio_vae.config.latent_mel_bins,
                   audio_vae.config.latents_per_second)

    def layout(self, num_frames: int, height: int, width: int, fps: float,
               frozen: Tensor | None = None, latent_size: tuple[int, int] | None = None) -> LTX2Layout:
        """Token layout of a video; `latent_size` overrides the latent (h, w) (the upsampled stage 2)."""
        c = self.dit
        f = (num_frames - 1) // self.temporal + 1
        h, w = latent_size or (height // self.spatial, width // self.spatial)
        # The pipeline sizes the audio from the video's duration: round(seconds * latents per second).
        audio_frames = round(num_frames / fps * self.audio_per_second)
        cpu = torch.device("cpu")
        video = video_positions(1, f, h, w, patch_t=c.patch_size_t, patch=c.patch_size, scale=c.vae_scale_factors,
                                causal_offset=c.causal_offset, fps=fps, device=cpu)
        audio = audio_positions(1, audio_frames, patch_t=c.audio_patch_size_t, scale=c.audio_scale_factor,
                                causal_offset=c.causal_offset, hop_length=c.audio_hop_length,
                                sample_rate=c.audio_sampling_rate, device=cpu)
        return LTX2Layout(f, h, w, audio_frames, LTX2Positions(video, audio), float(fps), frozen)

    def video_noise(self, layout: LTX2Layout, generator: torch.Generator) -> Tensor:
        shape = (1, self.video_channels, layout.frames, layout.height, layout.width)
        noise = torch.randn(shape, generator=generator, dtype=torch.float32)
        return pack_video(noise, self.dit.patch_size, self.dit.patch_size_t)

    def audio_noise(self, layout: LTX2Layout, generator: torch.Generator) -> Tensor:
        shape = (1, self.audio_channels, layout.audio_frames, self.audio_mel_bins)
        return pack_audio(torch.randn(shape, generator=generator, dtype=torch.float32))

    def unpack(self, tokens: Tensor, layout: LTX2Layout) -> Tensor:
        c = self.dit
        return unpack_video(tokens, layout.frames // c.patch_size_t, layout.height // c.patch_size,
                            layout.width // c.patch_size, c.patch_size, c.patch_size_t)

    def pack(self, latents: Tensor) -> Tensor:
        return pack_video(latents, self.dit.patch_size, self.dit.patch_size_t)


def noised(latents: Tensor, scale: float | Tensor, generator: torch.Generator) -> Tensor:
    """scale * noise + (1 - scale) * latents, the noise drawn like the pipeline (CPU generator, float32)."""
    noise = torch.randn(latents.shape, generator=generator, dtype=torch.float32).to(latents.device)
    return scale * noise + (1 - scale) * latents


def recompress(image: Image.Image, crf: int) -> Image.Image:
    """The image after one H.264 round trip at `crf` (0: unchanged), so first-frame conditioning carries the
    compression LTX-2 was trained on (Lightricks' ltx-pipelines media_io.preprocess, which the I2V pipeline
    ports as apply_image_conditioning_crf: libx264 "veryfast", yuv420p, even sides)."""
    if crf == 0:
        return image
    import io

    import av

    array = np.asarray(image.convert("RGB"), dtype=np.uint8)
    array = array[: array.shape[0] // 2 * 2, : array.shape[1] // 2 * 2]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=1, options={"crf": str(crf), "preset": "veryfast"})
        stream.height, stream.width = array.shape[:2]
        container.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24").reformat(format="yuv420p")))
        container.mux(stream.encode())
    buffer.seek(0)
    with av.open(buffer) as container:
        frame = next(container.decode(container.streams.video[0]))
        return Image.fromarray(frame.to_ndarray(format="rgb24"))


def image_pixels(image: Image.Image, height: int, width: int) -> Tensor:
    """[1, 3, H, W] in [-1, 1]: LTX2ImageToVideoPipeline's preprocessing of a PIL image (its VideoProcessor
    resizes bilinearly, not with diffusers' default Lanczos)."""
    image = image.convert("RGB")
    if image.size != (width, height):
        image = image.resize((width, height), resample=Image.Resampling.BILINEAR)
    array = np.asarray(image, dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1)[None] * 2.0 - 1.0
