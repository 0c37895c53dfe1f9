"""Where Cosmos3's generation tokens sit: patch grids, noisy frames and 3D rotary positions.

The joint sequence is [text prefix | vision tokens | sound tokens | action tokens]. Text positions run 0..L-1 on all
three rope axes; generated modalities start `temporal_margin` past the text on the t axis, with h/w
restarting at 0 and (for video, with fps modulation) t scaled by the frame rate. Action step i sits where
pixel frame i + 1 does (the transition into it), on the vision clock. The position rules
follow diffusers' `get_3d_mrope_ids_*` helpers step by step, because the checkpoint was trained on them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from vidloom.families.cosmos3.gen_config import Cosmos3GenConfig


def text_prefix_positions(length: int, config: Cosmos3GenConfig) -> Tensor:
    """[3, length] positions of the text prefix (float when fps modulation is on, as the reference)."""
    dtype = torch.float32 if config.enable_fps_modulation else torch.long
    return torch.arange(length, dtype=dtype).unsqueeze(0).expand(3, -1).contiguous()


def grid_positions(grid: tuple[int, int, int], offset: float, config: Cosmos3GenConfig, fps: float | None,
                   temporal_factor: int, base_temporal_factor: int | None = None, start: int = 0) -> Tensor:
    """[3, t*h*w] positions of a latent grid starting at temporal `offset`.

    With fps modulation (video only: a one-frame grid has no time axis to scale) the t position of
    latent frame i is (i + start) / (fps / factor) * (base_fps / base_factor) + offset, a float.
    """
    t, h, w = grid
    modulated = config.enable_fps_modulation and fps is not None and t > 1
    if modulated:
        tps = fps / temporal_factor
        base_tps = config.base_fps / (base_temporal_factor or temporal_factor)
        t_index = ((torch.arange(t, dtype=torch.float32) + start) / tps * base_tps + offset).view(-1, 1)
    else:
        t_index = (torch.arange(t, dtype=torch.long) + int(offset) + start).view(-1, 1)
    t_index = t_index.expand(-1, h * w).flatten()
    h_index = torch.arange(h).view(1, -1, 1).expand(t, -1, w).flatten()
    w_index = torch.arange(w).view(1, 1, -1).expand(t, h, -1).flatten()
    if not config.reset_spatial_ids:
        h_index, w_index = h_index + int(offset), w_index + int(offset)
    if modulated:
        return torch.stack([t_index, h_index.float(), w_index.float()])
    return torch.stack([t_index, h_index, w_index])


@dataclass(frozen=True)
class GenLayout:
    """One request's generation tokens: the vision grid, which latent frames are denoised, sound length,
    action steps and which of them are denoised."""

    latent_shape: tuple[int, int, int, int]  # C, T, h, w of the vision latents
    patch: int
    noisy_frames: tuple[int, ...]  # latent frames the model denoises (I2V keeps frame 0 clean)
    positions: Tensor  # [3, vision (+ sound) (+ action) tokens], float32
    sound_len: int = 0
    action_len: int = 0
    action_noisy: tuple[int, ...] = ()  # action steps the model denoises (forward dynamics gives them all)
    # `noisy_frames` as a long tensor on the device, built before a captured step (GenLayout.on): a step that made it
    # from the tuple would copy host memory to the device while capturing. None: the step makes it (eager runs).
    noisy_index: Tensor | None = None

    def batch_key(self) -> tuple[object, ...]:
        """Equal for layouts whose generated tokens sit alike: same grid, noisy frames, sound and action steps, and
        the same positions (they follow the prompt's length and the fps). Requests of equal keys stack."""
        positions = self.positions.detach().cpu().contiguous()
        return (self.latent_shape, self.patch, self.noisy_frames, self.sound_len, self.action_len, self.action_noisy,
                positions.dtype, tuple(positions.shape), positions.numpy().tobytes())

    def on(self, device: torch.device) -> GenLayout:
        """This layout with its positions and noisy-frame index on `device` (the same values): what a captured step
        reads as tensor inputs, refilled at every replay (runtime.cudagraph), never copied from the host inside it."""
        return dataclasses.replace(self, positions=self.positions.to(device),
                                   noisy_index=torch.tensor(self.noisy_frames, dtype=torch.long, device=device))

    @property
    def grid(self) -> tuple[int, int, int]:
        _, t, h, w = self.latent_shape
        return t, math.ceil(h / self.patch), math.ceil(w / self.patch)

    @property
    def frame_tokens(self) -> int:
        return self.grid[1] * self.grid[2]

    @property
    def vision_tokens(self) -> int:
        return self.grid[0] * self.frame_tokens

    @property
    def tokens(self) -> int:
        return self.vision_tokens + self.sound_len + self.action_len

    @classmethod
    def build(cls, config: Cosmos3GenConfig, latent_shape: tuple[int, int, int, int], prefix_len: int,
              fps: float, temporal_factor: int, cond_frames: tuple[int, ...] = (), sound_len: int = 0,
              action_len: int = 0, action_cond: tuple[int, ...] = ()) -> GenLayout:
        _, t, h, w = latent_shape
        p = config.latent_patch_size
        grid = (t, math.ceil(h / p), math.ceil(w / p))
        # The generated modalities start after the text plus the margin; sound is vision's temporal sibling.
        offset = prefix_len + config.temporal_margin
        parts = [grid_positions(grid, offset, config, fps, temporal_factor).float()]
        if sound_len:
            parts.append(grid_positions((sound_len, 1, 1), offset, config, config.sound_latent_fps, 1).float())
        if action_len:  # one token per step, timed in pixel frames against the video's latent clock
            parts.append(grid_positions((action_len, 1, 1), offset, config, fps, 1, temporal_factor, start=1).float())
        noisy = tuple(i for i in range(t) if i not in set(cond_frames))
        action_noisy = tuple(i for i in range(action_len) if i not in set(action_cond))
        return cls(latent_shape=latent_shape, patch=p, noisy_frames=noisy, positions=torch.cat(parts, dim=1),
                   sound_len=sound_len, action_len=action_len, action_noisy=action_noisy)


def patchify(latents: Tensor, patch: int) -> Tensor:
    """[C, T, h, w] -> [T*ph*pw, patch*patch*C] tokens (zero-padded to whole patches), in (t, h, w) order."""
    c, t, h, w = latents.shape
    ph, pw = math.ceil(h / patch), math.ceil(w / patch)
    if (ph * patch, pw * patch) != (h, w):
        padded = latents.new_zeros(c, t, ph * patch, pw * patch)
        padded[:, :, :h, :w] = latents
        latents = padded
    x = latents.reshape(c, t, ph, patch, pw, patch)
    return x.permute(1, 2, 4, 3, 5, 0).reshape(t * ph * pw, patch * patch * c)


def unpatchify(tokens: Tensor, frames: int, shape: tuple[int, int, int, int], patch: int) -> Tensor:
    """[frames*ph*pw, patch*patch*C] -> [C, frames, h, w] (the padding cut off)."""
    c, _, h, w = shape
    ph, pw = math.ceil(h / patch), math.ceil(w / patch)
    x = tokens.reshape(frames, ph, pw, patch, patch, c).permute(5, 0, 1, 3, 2, 4)
    return x.reshape(c, frames, ph * patch, pw * patch)[:, :, :h, :w]
