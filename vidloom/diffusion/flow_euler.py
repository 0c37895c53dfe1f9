"""Flow-matching Euler sampler: diffusers' FlowMatchEulerDiscreteScheduler update, with float32 state (see `step`)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from vidloom.diffusion.sampler import ConfiguredSampler, Schedule, ScheduleState, check_index, shift_sigmas


class FlowEulerSampler(ConfiguredSampler):
    """x_{i+1} = x_i + (sigma_{i+1} - sigma_i) * v, with v the model's velocity (Esser et al. 2024)."""

    name: ClassVar[str] = "euler"

    def _schedule(self, num_steps: int) -> Schedule:
        n_train = self.config.num_train_timesteps
        shift = self.config.shift

        # diffusers spans the inference grid between the ends of its shifted float32
        # training grid (sigmas N/N .. 1/N), not between 1 and 0; rebuild those two ends
        # with the same float32 ops so t_max / t_min carry the same rounding.
        ends = torch.tensor([n_train, 1], dtype=torch.float32) / n_train
        sigma_max, sigma_min = shift_sigmas(ends, shift).tolist()

        # The inference grid itself is float64 numpy (np.linspace, not torch.linspace:
        # the two place interior points with different rounding).
        t_grid = np.linspace(sigma_max * n_train, sigma_min * n_train, num_steps)
        sigmas = torch.from_numpy(shift_sigmas(t_grid / n_train, shift)).to(torch.float32)
        # Timesteps are recomputed from the float32 sigmas and stay float32.
        return Schedule.from_sigmas(sigmas, n_train)

    def init_state(
        self, schedule: Schedule, start: int = 0, generator: torch.Generator | None = None
    ) -> ScheduleState:
        check_index(schedule, start)  # Euler is one-step: starting later needs no other state
        return ScheduleState(schedule=schedule)

    def step(
        self, state: ScheduleState, index: int, model_output: torch.Tensor, sample: torch.Tensor
    ) -> torch.Tensor:
        check_index(state.schedule, index)
        sigmas = state.schedule.sigmas
        # 0-dim float32 CPU tensors, as diffusers uses, so the scalar enters the kernel identically.
        dt = sigmas[index + 1] - sigmas[index]
        # The update itself follows diffusers' FlowMatchEulerDiscreteScheduler.step term for term.
        # Where we part from it on purpose: diffusers casts the new sample back to the model's
        # dtype (bf16 on GPU), rounding the latents every step. The sampler state stays float32
        # here, as in UniPC (diffusers' UniPC keeps float32 too) and as the denoise loop documents;
        # the loop casts to the model dtype only for the DiT input. In float32 (the parity tests)
        # both are the same; in bf16 ours skips one bf16 rounding of the latents per step.
        return sample.to(torch.float32) + dt * model_output
