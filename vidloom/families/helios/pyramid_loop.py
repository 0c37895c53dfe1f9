"""Helios' pyramid chunk loop (HeliosPyramidPipeline): the base rollout, with each chunk's noise halved to the
first stage's grid and denoised stage by stage; between stages the latents are upsampled (nearest) and renoised
with patch-correlated noise from the request's generator. CFG-Zero* (is_cfg_zero_star) rescales the uncond branch
and zeroes the first stage's first ZERO_INIT_STEPS + 1 predictions, as the reference's defaults do."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from vidloom.core.errors import InvalidRequest
from vidloom.diffusion.guidance import GuidancePolicy, GuidanceScale, Network, TwoBranchCFG
from vidloom.diffusion.sampler import Schedule
from vidloom.families.helios.loop import HeliosChunkLoop, HeliosChunkState
from vidloom.families.helios.pyramid import (
    ZERO_INIT_STEPS, StageRange, block_noise, cfg_zero_star, downsample, renoise_alpha, stage_ranges,
    stage_schedule, split_steps, upsample,
)


class ZeroStarCFG:
    """CFG-Zero*'s combine over another policy's two branches (sequential, batched or parallel)."""

    def __init__(self, inner: TwoBranchCFG) -> None:
        self.inner = inner

    def __call__(self, network: Network, latents: Tensor, timestep: Tensor, prompt_embeds: Tensor,
                 negative_embeds: Tensor | None, guidance_scale: GuidanceScale) -> Tensor:
        if negative_embeds is None:
            return self.inner.unguided(network, latents, timestep, prompt_embeds)
        cond, uncond = self.inner.branches(network, latents, timestep, prompt_embeds, negative_embeds)
        return cfg_zero_star(cond, uncond, guidance_scale)


class HeliosPyramidLoop(HeliosChunkLoop):
    """The pyramid's chunk rollout; num_inference_steps is split over the stages (split_steps)."""

    def __init__(self, *args: Any, zero_star: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zero_star = zero_star
        if zero_star:
            assert isinstance(self.guidance, TwoBranchCFG), "CFG-Zero* combines a two-branch policy's outputs"
            self.guidance: GuidancePolicy = ZeroStarCFG(self.guidance)
        self.ranges = stage_ranges(self.schedule)

    def _schedules(self, num_steps: int, h: int, w: int) -> tuple[Schedule, ...]:
        stages = self.schedule.stages
        if num_steps < stages:
            raise InvalidRequest("num_inference_steps", f"is {num_steps}; the pyramid needs at least one step in "
                                                        f"each of its {stages} stages")
        return self._stage_schedules(split_steps(num_steps, stages), h, w)

    def _stage_schedules(self, steps: tuple[int, ...], h: int, w: int) -> tuple[Schedule, ...]:
        """One schedule per stage of `steps[s]` steps on an h x w (full-size) latent grid."""
        # A stage's time shift counts the tokens of the grid it starts from: the previous stage's (the first: its own).
        stages = self.schedule.stages
        sizes = [(h >> (stages - 1 - s), w >> (stages - 1 - s)) for s in range(stages)]
        return tuple(self._stage_schedule(self.ranges[s], n, self._tokens(*sizes[max(s - 1, 0)]))
                     for s, n in enumerate(steps))

    def _stage_schedule(self, stage: StageRange, num_steps: int, tokens: int) -> Schedule:
        return stage_schedule(self.schedule, stage, num_steps, tokens)

    def _start_chunk(self, state: HeliosChunkState) -> None:
        state.stage = 0
        state.schedule = state.current_schedules[0]
        state.latents = downsample(self._noise(state.generator, state.history), self.schedule.stages - 1)
        state.sampler_state = state.sampler.init_state(state.schedule)

    def _timestep(self, state: HeliosChunkState) -> Tensor:
        return state.schedule.timesteps[state.step].reshape(1).to(torch.int64).to(self.device)  # as the reference

    def advance(self, state: HeliosChunkState, result: Any) -> HeliosChunkState:
        if (self.zero_star and state.negative_embeds is not None and state.stage == 0
                and state.step <= ZERO_INIT_STEPS):
            result = result * 0.0
        state.latents = state.sampler.step(state.sampler_state, state.step, result, state.latents)
        state.step += 1
        if state.step < state.schedule.num_steps:
            return state
        if state.stage + 1 < len(state.current_schedules):
            self._next_stage(state)
        else:
            self._finish_chunk(state)
        return state

    def _next_stage(self, state: HeliosChunkState) -> None:
        """Upsample the finished stage and renoise it to the next stage's start (the variance-keeping correction)."""
        state.stage, state.step = state.stage + 1, 0
        state.schedule = state.current_schedules[state.stage]
        latents = upsample(state.latents)
        gamma = self.schedule.gamma
        signal = 1 - self.ranges[state.stage].ori_start_sigma
        alpha = renoise_alpha(signal, gamma)
        beta = alpha * (1 - signal) / math.sqrt(gamma)
        patch = tuple(self.transformer.config.patch_size[1:])
        noise = block_noise(tuple(latents.shape), patch, gamma, state.generator)  # type: ignore[arg-type]
        state.latents = alpha * latents + beta * noise.to(self.device, self.dtype)
        state.sampler_state = state.sampler.init_state(state.schedule)
