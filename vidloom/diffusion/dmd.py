"""Few-step sampling for DMD-distilled checkpoints (FastWan): predict x0, re-noise to the next timestep.

Distribution Matching Distillation (Yin et al. 2024, arXiv:2311.18828; Yin et al. 2024, "Improved
DMD", arXiv:2405.14867) trains a generator to jump to x0 from a short fixed list of timesteps.
Sampling follows FastVideo's DMD denoising stage: at each listed timestep the network's flow
prediction v gives x0 = x_t - sigma_t * v; unless it is the last step, x0 is re-noised to the next
listed timestep with fresh noise from the request's generator: x = (1 - sigma') * x0 + sigma' * noise.
The sigma of a timestep t is t / num_train_timesteps (the flow-matching convention of the shifted
schedule the checkpoint was trained with, where timesteps are sigmas x 1000).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from vidloom.diffusion.sampler import ConfiguredSampler, Schedule, check_index


@dataclass
class DMDState:
    """A request's DMD run: its schedule and the generator its re-noising draws from."""

    schedule: Schedule
    generator: torch.Generator


class DMDSampler(ConfiguredSampler):
    """The few-step sampler a distilled checkpoint's RecipeSpec names; its timesteps come from the recipe."""

    name: ClassVar[str] = "dmd"

    def _schedule(self, num_steps: int) -> Schedule:
        steps = self.config.dmd_timesteps
        if not steps:
            raise ValueError("the dmd sampler needs the checkpoint's distilled timesteps (RecipeSpec.timesteps)")
        if num_steps != len(steps):
            raise ValueError(f"this checkpoint was distilled for {len(steps)} steps {list(steps)}, not {num_steps}")
        timesteps = torch.tensor(steps, dtype=torch.float32)
        sigmas = timesteps / self.config.num_train_timesteps
        return Schedule(timesteps=timesteps, sigmas=torch.cat([sigmas, torch.zeros(1)]))

    def init_state(self, schedule: Schedule, start: int = 0, generator: torch.Generator | None = None) -> DMDState:
        check_index(schedule, start)
        if start:
            raise ValueError("dmd runs its whole step list (no partial schedules such as video-to-video)")
        return DMDState(schedule=schedule, generator=generator or torch.Generator("cpu").manual_seed(0))

    def step(self, state: DMDState, index: int, model_output: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
        check_index(state.schedule, index)
        sigmas = state.schedule.sigmas
        x0 = sample - sigmas[index] * model_output
        if index == state.schedule.num_steps - 1:
            return x0
        # CPU generator and float32, like the initial noise, so a seed gives the same video on any device.
        noise = torch.randn(x0.shape, generator=state.generator, dtype=torch.float32).to(x0.device)
        following = sigmas[index + 1]
        return (1 - following) * x0 + following * noise
