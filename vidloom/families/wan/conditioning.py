"""Image conditioning of Wan denoising: what an I2V request adds around each DiT call.

Two layouts exist (both as diffusers' WanImageToVideoPipeline builds them, whose steps we follow
for parity):
- Wan2.1 I2V / first-last-frame: the DiT reads 4 mask channels and the VAE latents of a video that
  is the given frame(s) and zeros, appended to the noisy latents, plus CLIP image tokens.
- Wan2.2 TI2V (`expand_timesteps`): the first latent frame is replaced by the image's latents and
  kept clean; its tokens get timestep 0 while the others get the step's timestep.
Video-to-video (diffusers' WanVideoToVideoPipeline) instead starts denoising part-way down the
schedule from the input video's latents, noised to that step's sigma.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from torch import Tensor

from vidloom.layers.prompt_kv import PromptKV
from vidloom.media.image import image_to_tensor
from vidloom.models.wan.transformer import WanConditioning
from vidloom.models.wan.vae import WanVAE


@dataclass(frozen=True)
class WanPipelineConfig:
    """What a checkpoint's model_index.json says about its denoise loop (diffusers' pipeline config)."""

    expand_timesteps: bool = False
    """Wan2.2 TI2V: per-token timesteps; an I2V image is the clean first latent frame."""
    boundary_ratio: float | None = None
    """Wan2.2 A14B: timesteps >= boundary_ratio * 1000 run `transformer`, lower ones `transformer_2`."""


@dataclass(frozen=True)
class ImageConditionedNetwork:
    """A DiT with one request's CLIP tokens bound: the (latents, timestep, text) network a guidance
    policy calls, staged like the DiT itself so step caches work unchanged. Built per request."""

    transformer: Any  # a WanTransformer, or a PlacedNetwork around one
    image_embeds: Tensor
    """CLIP tokens [n_images, I, image_dim] of this request (of each request, in order, once stacked)."""
    requests: int = 1
    """How many requests' tokens `image_embeds` holds: 1, or the size of a cross-request batch (`stack`)."""
    image_kv: PromptKV | None = None
    """Every block's image keys/values of `image_embeds` (prepare_network: once per request), or None (every step
    projects them). Rows: each request's image rows, in request order."""

    def batch_key(self) -> tuple[Any, ...]:
        """Views with equal keys stack (runtime.batching): same DiT, same image token shape and dtype, all
        prepared alike."""
        inner = getattr(self.transformer, "batch_key", None)
        net = inner() if callable(inner) else ("module", id(self.transformer))
        prepared = None if self.image_kv is None else self.image_kv.batch_key()
        return (net, tuple(self.image_embeds.shape[1:]), self.image_embeds.shape[0] // self.requests,
                self.image_embeds.dtype, prepared)

    @staticmethod
    def stack(views: list["ImageConditionedNetwork"]) -> "ImageConditionedNetwork":
        """One network for requests stacked along the batch (equal keys): their CLIP tokens stacked in order."""
        image_kv = views[0].image_kv and PromptKV.stack([v.image_kv for v in views])  # type: ignore[misc]
        return ImageConditionedNetwork(views[0].transformer, torch.cat([v.image_embeds for v in views], dim=0),
                                       sum(v.requests for v in views), image_kv)

    def prepare_network(self) -> "ImageConditionedNetwork | None":
        """This request's view with its image keys/values prepared (core.denoiser.PreparesPrompt): the CLIP tokens
        are the same at every step and in both CFG branches."""
        return dataclasses.replace(self, image_kv=self.transformer.prepare_image(self.image_embeds))

    @property
    def num_blocks(self) -> int:
        return self.transformer.num_blocks

    def __call__(self, latents: Tensor, timestep: Tensor, text_embeds: Tensor) -> Tensor:
        x, cond = self.embed(latents, timestep, text_embeds)
        return self.head(self.run_blocks(x, cond), cond)

    def prepare_prompt(self, text_embeds: Tensor) -> Any:
        """The DiT's prompt keys/values (core.denoiser.PreparesPrompt): the image tokens do not enter them."""
        return self.transformer.prepare_prompt(text_embeds)

    def embed(self, latents: Tensor, timestep: Tensor, text_embeds: Tensor) -> tuple[Tensor, WanConditioning]:
        # Rows are the stacked requests in order, repeated per CFG branch ([r1, r2, r1, r2] when batched):
        # repeating the stacked tokens (or their keys/values) the same way gives every row its own request's images.
        branches = latents.shape[0] // self.requests
        if self.image_kv is not None:
            return self.transformer.embed(latents, timestep, text_embeds, self.image_kv.repeat(branches))
        return self.transformer.embed(latents, timestep, text_embeds, self.image_embeds.repeat(branches, 1, 1))

    def run_blocks(self, x: Tensor, cond: Any, start: int = 0, end: int | None = None) -> Tensor:
        return self.transformer.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: Any, index: int = 0) -> Tensor:
        return self.transformer.block_input(x, cond, index)

    def head(self, x: Tensor, cond: Any) -> Tensor:
        return self.transformer.head(x, cond)


def _encode_frames(vae: WanVAE, video: Tensor) -> Tensor:
    """Normalised float32 latents (the distribution's mode) of video [1, 3, F, H, W] in [-1, 1]."""
    dtype = next(vae.parameters()).dtype
    raw = vae.encode(video.to(vae.post_quant_conv.weight.device, dtype)).mean
    return vae.normalize_latents(raw.float())


def wan21_condition(
    vae: WanVAE, image: Image.Image, last_image: Image.Image | None, num_frames: int, height: int, width: int
) -> Tensor:
    """[1, temporal_factor + z, T, h, w]: which frames are given (mask) and their VAE latents."""
    first = image_to_tensor(image, height, width)
    frames = torch.zeros(3, num_frames, height, width)
    frames[:, 0] = first
    given = torch.zeros(num_frames)
    given[0] = 1.0
    if last_image is not None:
        frames[:, -1] = image_to_tensor(last_image, height, width)
        given[-1] = 1.0
    latents = _encode_frames(vae, frames[None])
    step = vae.config.temporal_factor
    # The first frame stands for a whole latent frame: repeat its flag so flags group into T x step.
    flags = torch.cat([given[:1].repeat(step - 1), given])  # [step * T]
    _, _, t, h, w = latents.shape
    mask = flags.view(t, step).transpose(0, 1)[None, :, :, None, None].expand(1, step, t, h, w)
    return torch.cat([mask.to(latents), latents], dim=1)


def first_frame_condition(
    vae: WanVAE, image: Image.Image, latent_frames: int, height: int, width: int
) -> tuple[Tensor, Tensor]:
    """Wan2.2 TI2V: the image's latents [1, z, 1, h, w] and the frame mask [1, 1, T, h, w] (0 = kept)."""
    latents = _encode_frames(vae, image_to_tensor(image, height, width)[None, :, None])
    _, _, _, h, w = latents.shape
    mask = torch.ones(1, 1, latent_frames, h, w, device=latents.device)
    mask[:, :, 0] = 0.0
    return latents, mask


def keep_first_frame(latents: Tensor, condition: Tensor, mask: Tensor) -> Tensor:
    """The noisy latents with their kept frames replaced by the condition (diffusers' blend)."""
    return (1 - mask) * condition + mask * latents


def token_timesteps(mask: Tensor, t: Tensor, patch: tuple[int, int, int], batch: int) -> Tensor:
    """[batch, S]: t for every patch token whose frame is generated, 0 for kept-frame tokens."""
    p_t, p_h, p_w = patch
    per_token = mask[0, 0, ::p_t, ::p_h, ::p_w] * t
    return per_token.flatten()[None].expand(batch, -1)


def encode_video(vae: WanVAE, frames: list[Image.Image], height: int, width: int) -> Tensor:
    """Normalised latents [1, z, T, h, w] of RGB frames resized to height x width."""
    video = torch.stack([image_to_tensor(frame, height, width) for frame in frames], dim=1)  # [3, F, H, W]
    return _encode_frames(vae, video[None])


def v2v_start(num_steps: int, strength: float) -> int:
    """Index of the first step a video-to-video run takes: the last `strength` of the schedule
    (int(steps * strength) steps, rounded down, as diffusers' get_timesteps)."""
    return num_steps - min(int(num_steps * strength), num_steps)


def noise_to(latents: Tensor, noise: Tensor, sigma: Tensor) -> Tensor:
    """Flow-matching forward process at `sigma`: (1 - sigma) * x0 + sigma * noise (diffusers' add_noise)."""
    sigma = sigma.to(latents.device, latents.dtype)
    return (1 - sigma) * latents + sigma * noise
