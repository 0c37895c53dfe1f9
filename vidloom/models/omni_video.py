"""A Qwen-Omni thinker's video parts: frames sampled, resized and patchified as transformers' Qwen2-VL video
processor does, without torchvision (which cannot be installed beside our torch build).

Sampling follows `Qwen2VLVideoProcessor.sample_frames` with fps (qwen-omni-utils' 2 frames per second, at least
min_frames, at most max_frames, a multiple of temporal_patch_size). Each frame is resized and normalised as the
checkpoint's Qwen2-VL image processor treats an image (PIL resize with its resample filter, rescale, normalise:
the per-frame maths of the video processor, whose torchvision resize we cannot run), to one smart_resize size for
the whole clip within the Qwen3-Omni processor's video pixel bounds; frames are grouped temporal_patch_size at a
time into patches [grid_t * grid_h * grid_w, C * T * P * P] with the video processor's layout. One grid step spans
temporal_patch_size / fps seconds (the processor's video_second_per_grid).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vidloom.media.chat_video import CHAT_VIDEO_FPS, MIN_SAMPLED_FRAMES, ChatVideo

MAX_SAMPLED_FRAMES = 768  # Qwen2VLVideoProcessor's max_frames
# Qwen3OmniMoeProcessor's videos_kwargs size: 128 * 32 * 32 to 768 * 32 * 32 pixels per frame, i.e. 128 to 768
# merged tokens of (patch_size * merge_size)^2 pixels each.
MIN_FRAME_TOKENS, MAX_FRAME_TOKENS = 128, 768


@dataclass(frozen=True)
class SampledVideo:
    """A clip ready for the vision tower."""

    patches: Tensor  # [grid_t * grid_h * grid_w, C * T * P * P] float32
    grid_thw: Tensor  # [1, 3]
    second_per_grid: float  # seconds one temporal grid step spans


def sample_indices(total: int, video_fps: float, temporal: int, fps: float = CHAT_VIDEO_FPS,
                   min_frames: int = MIN_SAMPLED_FRAMES, max_frames: int = MAX_SAMPLED_FRAMES) -> list[int]:
    """Frame indices to sample from `total` frames at `video_fps`: transformers' Qwen2VLVideoProcessor.sample_frames
    with `fps` (followed step by step: its float32 arange picks the frames). [] when fewer than `temporal` frames."""
    cap = math.floor(min(max_frames, total) / temporal) * temporal
    count = min(max(total / video_fps * fps, min_frames), cap, total)
    count = math.floor(count / temporal) * temporal
    if count < temporal:
        return []
    return torch.arange(0, total, total / count).int().tolist()


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) multiples of `factor` near the input's, with area in [min_pixels, max_pixels]: the Qwen2-VL
    processors' rule (transformers' image_processing_qwen2_vl.smart_resize, the aspect ratio check left to the
    caller)."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def frame_pixels(frames: np.ndarray, processor: Any, size: tuple[int, int]) -> np.ndarray:
    """uint8 RGB frames [n, H, W, 3] -> float32 [n, 3, height, width] at `size` (height, width), resized, rescaled
    and normalised as `processor` (a Qwen2-VL image processor) treats one image."""
    height, width = size
    mean = np.asarray(processor.image_mean, dtype=np.float32).reshape(3, 1, 1)
    std = np.asarray(processor.image_std, dtype=np.float32).reshape(3, 1, 1)
    out = np.empty((frames.shape[0], 3, height, width), dtype=np.float32)
    for i, frame in enumerate(frames):
        resized = np.asarray(Image.fromarray(frame).resize((width, height), resample=int(processor.resample)))
        scaled = resized.transpose(2, 0, 1).astype(np.float32) * np.float32(processor.rescale_factor)
        out[i] = (scaled - mean) / std
    return out


def patchify(pixels: np.ndarray, patch: int, merge: int, temporal: int) -> tuple[Tensor, Tensor]:
    """[n, C, H, W] -> patches [gt * gh * gw, C * T * P * P] and grid [1, 3], the video processor's layout (the
    last frame repeated up to a multiple of `temporal`)."""
    if pad := -pixels.shape[0] % temporal:
        pixels = np.concatenate([pixels, np.repeat(pixels[-1:], pad, axis=0)])
    n, c, h, w = pixels.shape
    gt, gh, gw = n // temporal, h // patch, w // patch
    blocks = pixels.reshape(gt, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    blocks = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return (torch.from_numpy(np.ascontiguousarray(blocks).reshape(gt * gh * gw, c * temporal * patch * patch)),
            torch.tensor([[gt, gh, gw]]))


def video_inputs(video: ChatVideo, processor: Any) -> SampledVideo | None:
    """The clip's sampled frames as the vision tower's inputs; None when it has too few frames to sample."""
    patch, merge, temporal = int(processor.patch_size), int(processor.merge_size), int(processor.temporal_patch_size)
    indices = sample_indices(video.frame_count, video.fps, temporal)
    if not indices:
        return None
    factor = patch * merge
    width, height = video.size
    size = smart_resize(height, width, factor, MIN_FRAME_TOKENS * factor * factor, MAX_FRAME_TOKENS * factor * factor)
    patches, grid = patchify(frame_pixels(video.frames(indices), processor, size), patch, merge, temporal)
    return SampledVideo(patches, grid, temporal / CHAT_VIDEO_FPS)


def interleaved(video_t: Tensor, audio_tokens: int) -> list[bool]:
    """The order of a video's tokens and its sound track's (True: a video token), as transformers'
    Qwen3OmniMoeProcessor.replace_video_with_audio_token places them: a video token whose time position
    (`video_t`, one per token) is at most the next audio token's index goes first; the rest follow."""
    order, v, a = [], 0, 0
    while v < video_t.shape[0] and a < audio_tokens:
        if float(video_t[v]) <= a:
            order.append(True)
            v += 1
        else:
            order.append(False)
            a += 1
    return order + [True] * (video_t.shape[0] - v) + [False] * (audio_tokens - a)
