"""An action run's conditioning clip: frames -> the tier's canvas (downscaled, padded) -> VAE latents.

The preprocessing follows Cosmos3OmniPipeline's action path step by step (floor to the VAE's 16 with a
bilinear resize, bicubic antialiased downscale into the canvas, reflect/replicate padding right and
bottom, latents cropped back to the content), because the conditioning frames anchor every frame after.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from vidloom.families.cosmos3.actions import ResolvedAction


def decoded_frames(action: ResolvedAction) -> list[Image.Image]:
    """The conditioning frames as RGB PIL images (an upload is decoded here, on the run's thread)."""
    from vidloom.media.image import EncodedImage
    from vidloom.media.uploads import EncodedVideo

    frames: list[Image.Image] = []
    for item in action.media:
        if isinstance(item, EncodedVideo):
            frames.extend(item.decode())
        elif isinstance(item, EncodedImage):
            frames.append(item.decode())
        else:
            frames.append(item if item.mode == "RGB" else item.convert("RGB"))
    return frames


def conditioning_clip(action: ResolvedAction) -> Tensor:
    """[1, 3, chunk_size + 1, canvas_h, canvas_w] float32 in [-1, 1]: the frames placed in the canvas,
    the last one repeated (or the clip cut) to the chunk's length."""
    height, width = action.source_size
    pixels = []
    for frame in decoded_frames(action):
        if frame.size != (width, height):
            frame = frame.resize((width, height), resample=Image.Resampling.BILINEAR)
        pixels.append(torch.from_numpy(np.asarray(frame, dtype=np.float32) / 255.0).permute(2, 0, 1))
    clip = torch.stack(pixels) * 2.0 - 1.0  # [T, 3, h, w]
    count = action.num_frames
    if clip.shape[0] < count:
        clip = torch.cat([clip, clip[-1:].expand(count - clip.shape[0], -1, -1, -1)])
    clip = clip[:count]
    content_h, content_w = action.content
    if (content_h, content_w) != (height, width):
        clip = F.interpolate(clip, size=(content_h, content_w), mode="bicubic", align_corners=False, antialias=True)
    pad_h, pad_w = action.canvas[0] - content_h, action.canvas[1] - content_w
    if pad_h or pad_w:  # reflection needs a pad smaller than the content
        mode = "replicate" if pad_w >= content_w or pad_h >= content_h else "reflect"
        clip = F.pad(clip, (0, pad_w, 0, pad_h), mode=mode)
    return clip.permute(1, 0, 2, 3)[None]


def encode_clip(vae: Any, action: ResolvedAction, device: torch.device) -> Tensor:
    """The clip's normalized latent means [C, T, h, w] (float32), cropped to the content's latent grid.

    Only inverse dynamics keeps more than latent frame 0 clean. The VAE is causal in time (latent frame 0
    is the first pixel frame's alone), so the other modes encode that frame only: the latent the reference
    gets from the whole repeated clip, for a fraction of the work. The other frames' latents are zeros
    (noise replaces them).
    """
    clip = conditioning_clip(action).to(device)
    frames = (action.num_frames - 1) // vae.config.temporal_factor + 1
    if action.mode != "inverse_dynamics":
        clip = clip[:, :, :1]
    vae_dtype = next(vae.parameters()).dtype
    latents = vae.normalize_latents(vae.encode(clip.to(vae_dtype)).mean)[0].float()
    factor = vae.config.spatial_factor
    h, w = (max(side // factor, 1) for side in action.content)
    out = latents.new_zeros(latents.shape[0], frames, h, w)
    out[:, : latents.shape[1]] = latents[:, :, :h, :w]
    return out
