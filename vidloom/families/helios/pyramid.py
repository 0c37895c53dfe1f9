"""Helios' pyramid (HeliosPyramidPipeline + a multi-stage HeliosScheduler): each chunk is denoised in stages from
a 2^(S-1)x smaller latent grid up to the full one, each stage a full solver run over its own slice of the timestep
range, and CFG-Zero* for the checkpoints that ask for it (is_cfg_zero_star: Helios-Mid).

Parity with the reference forces following its numeric core step by step (stage ranges measured on the shifted
train sigmas, the renoise correction, the block noise's draw order): diffusers' HeliosScheduler and
HeliosPyramidPipeline (Apache-2.0; NOTICE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vidloom.diffusion.guidance import GuidanceScale, cfg_combine
from vidloom.diffusion.sampler import Schedule
from vidloom.families.helios.schedule import HeliosSchedule, calculate_mu, time_shift

STAGE_SIGMA_MAX = 0.999  # every stage's sigmas: linspace(0.999, 0, 1001)[:-1], cut to its steps
LAST_STAGE_END_RATIO = 0.9999999999999999  # the reference's end of the last stage's timestep ratio
ZERO_INIT_STEPS = 1  # HeliosPyramidPipeline's zero_steps: CFG-Zero* zeroes steps 0..1 of the first stage


@dataclass(frozen=True)
class StageRange:
    """One stage's slice of the train timesteps and the signal level it starts from."""

    timestep_max: float
    timestep_min: float
    ori_start_sigma: float  # the train sigma at the stage's start (before the renoise correction)


def stage_ranges(schedule: HeliosSchedule) -> tuple[StageRange, ...]:
    """Each stage's timestep slice: the stages split the distance they cover (start sigmas corrected for the
    renoise) in proportion, measured on the shifted train sigmas."""
    n = schedule.num_train_timesteps
    alphas = np.linspace(1, 1 / n, n + 1)
    train = 1.0 - alphas
    train = np.flip(schedule.shift * train / (1 + (schedule.shift - 1) * train))[:-1].copy()
    timesteps = train * n
    starts, distances = [], []
    for s in range(schedule.stages):
        start = max(int(schedule.stage_range[s] * n), 0)
        end = min(int(schedule.stage_range[s + 1] * n), n)
        start_sigma = float(train[start])
        end_sigma = float(train[end]) if end < n else 0.0
        starts.append(start_sigma)
        if s:
            signal = 1 - start_sigma
            start_sigma = 1 - renoise_alpha(signal, schedule.gamma) * signal
        distances.append(start_sigma - end_sigma)
    total = sum(distances)
    out = []
    for s in range(schedule.stages):
        lo = 0.0 if s == 0 else sum(distances[:s]) / total
        hi = LAST_STAGE_END_RATIO if s == schedule.stages - 1 else sum(distances[: s + 1]) / total
        t_max = min(float(timesteps[int(lo * n)]), n - 1)
        t_min = float(timesteps[min(int(hi * n), n - 1)])
        # The stage's own grid: linspace(t_max, t_min, n + 1)[:-1]; its last entry bounds the stage.
        out.append(StageRange(t_max, float(np.linspace(t_max, t_min, n + 1)[n - 1]), starts[s]))
    return tuple(out)


def stage_schedule(schedule: HeliosSchedule, stage: StageRange, num_steps: int, tokens: int) -> Schedule:
    """One stage's sigmas (0.999 -> ~0, then 0) and timesteps inside its slice, float64."""
    top = STAGE_SIGMA_MAX
    bottom = float(np.linspace(STAGE_SIGMA_MAX, 0, schedule.num_train_timesteps + 1)[schedule.num_train_timesteps - 1])
    sigmas = torch.cat([torch.from_numpy(np.linspace(top, bottom, num_steps)), torch.zeros(1, dtype=torch.float64)])
    timesteps = torch.from_numpy(np.linspace(stage.timestep_max, stage.timestep_min, num_steps))
    if schedule.dynamic_shift:
        mu = calculate_mu(tokens, schedule.base_image_seq_len, schedule.max_image_seq_len, schedule.base_shift,
                          schedule.max_shift)
        sigmas = time_shift(mu, sigmas, schedule.exponential)
        lo = min(stage.timestep_max, stage.timestep_min)
        hi = max(stage.timestep_max, stage.timestep_min)
        timesteps = lo + sigmas[:-1] * (hi - lo)
    return Schedule(timesteps=timesteps, sigmas=sigmas)


def split_steps(total: int, stages: int) -> tuple[int, ...]:
    """`total` steps over `stages` stages, as even as can be, the earlier stages taking the remainder."""
    base, extra = divmod(total, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))


def renoise_alpha(signal: float, gamma: float) -> float:
    """The scale that keeps an upsampled latent's variance once block noise of correlation gamma is added."""
    return 1 / (math.sqrt(1 + 1 / gamma) * (1 - signal) + signal)


def _frames_first(latents: Tensor) -> Tensor:
    b, c, f, h, w = latents.shape
    return latents.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)


def _channels_first(frames: Tensor, batch: int) -> Tensor:
    bf, c, h, w = frames.shape
    return frames.reshape(batch, bf // batch, c, h, w).permute(0, 2, 1, 3, 4)


def downsample(latents: Tensor, times: int) -> Tensor:
    """[B, C, F, H, W] halved `times` times (bilinear, scaled by 2 each time: the pyramid's first stage)."""
    frames = _frames_first(latents)
    for _ in range(times):
        frames = F.interpolate(frames, size=(frames.shape[-2] // 2, frames.shape[-1] // 2), mode="bilinear") * 2
    return _channels_first(frames, latents.shape[0])


def upsample(latents: Tensor) -> Tensor:
    """[B, C, F, h, w] -> [B, C, F, 2h, 2w], nearest."""
    frames = _frames_first(latents)
    frames = F.interpolate(frames, size=(frames.shape[-2] * 2, frames.shape[-1] * 2), mode="nearest")
    return _channels_first(frames, latents.shape[0])


def block_noise_factor(gamma: float, block: int) -> Tensor:
    """The Cholesky factor of the block covariance (1 + gamma) I - gamma 11^T (+1e-8 I), float32.

    At gamma = 1 / (block - 1) (1/3 for 2x2 patches: the published value) the covariance is singular but for the
    1e-8, below float32's resolution at 1 + gamma: float32 Cholesky then fails on some CPUs' LAPACK
    code path (others return a rounding-sized last pivot). It is factored in float64,
    where the 1e-8 keeps it positive definite, and rounded to float32 (the factor differs from a successful float32
    one by float32 rounding)."""
    cov = torch.eye(block, dtype=torch.float64) * (1 + gamma) - torch.ones(block, block, dtype=torch.float64) * gamma
    cov += torch.eye(block, dtype=torch.float64) * 1e-8
    return torch.linalg.cholesky(cov).float()


def block_noise(shape: tuple[int, int, int, int, int], patch: tuple[int, int], gamma: float,
                generator: torch.Generator) -> Tensor:
    """Noise [B, C, F, H, W] correlated within each ph x pw patch, drawn on the CPU from `generator`."""
    b, c, f, h, w = shape
    ph, pw = patch
    factor = block_noise_factor(gamma, ph * pw)
    z = torch.randn(b * c * f * (h // ph) * (w // pw), ph * pw, generator=generator)
    noise = (z @ factor.T).view(b, c, f, h // ph, w // pw, ph, pw)
    return noise.permute(0, 1, 2, 3, 5, 4, 6).reshape(b, c, f, h, w)


def cfg_zero_star(cond: Tensor, uncond: Tensor, scale: GuidanceScale) -> Tensor:
    """CFG-Zero* (Fan et al. 2025, arXiv:2503.18886): the uncond branch rescaled by the per-sample projection of
    cond onto it, s* = <cond, uncond> / |uncond|^2 (float32), then classic CFG (cfg_combine: a captured step's 0-dim
    scale tensor multiplies exactly as the eager float, never read back to the host)."""
    b = cond.shape[0]
    pos, neg = cond.reshape(b, -1).float(), uncond.reshape(b, -1).float()
    star = (pos * neg).sum(dim=1, keepdim=True) / ((neg ** 2).sum(dim=1, keepdim=True) + 1e-8)
    star = star.view(b, *([1] * (cond.dim() - 1))).to(cond.dtype)
    return cfg_combine(cond, uncond * star, scale)
