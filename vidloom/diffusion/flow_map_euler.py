"""Flow-map Euler sampler (AnyFlow), numerically equal to diffusers' FlowMapEulerDiscreteScheduler.

A flow-map model predicts the mean velocity u(z_t, t, r) over a whole interval, so one
call jumps from noise level t straight to r: z_r = z_t - (sigma_t - sigma_r) * u.
The model must therefore be told both ends of every step (see `target_timestep`).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from vidloom.diffusion.sampler import ConfiguredSampler, Schedule, ScheduleState, check_index, shift_sigmas


class FlowMapEulerSampler(ConfiguredSampler):
    """Any-step Euler over a flow map (Gu et al. 2026, AnyFlow, arXiv:2605.13724)."""

    name: ClassVar[str] = "flow_map_euler"

    def _schedule(self, num_steps: int) -> Schedule:
        """Shifted linspace(1, 0) noise levels; sigmas and timesteps stay float64, as the reference keeps them."""
        sigmas = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)[:-1]
        if self.config.shift != 1.0:  # the reference skips the (exact) identity shift
            sigmas = shift_sigmas(sigmas, self.config.shift)
        return Schedule.from_sigmas(sigmas, self.config.num_train_timesteps)

    def target_timestep(self, schedule: Schedule, index: int) -> torch.Tensor:
        """The timestep r that step `index` lands on (the flow map's second input), float64 0-dim."""
        check_index(schedule, index)
        return schedule.sigmas[index + 1] * self.config.num_train_timesteps

    def init_state(
        self, schedule: Schedule, start: int = 0, generator: torch.Generator | None = None
    ) -> ScheduleState:
        check_index(schedule, start)  # one-step, as Euler: starting later needs no other state
        return ScheduleState(schedule=schedule)

    def step(
        self, state: ScheduleState, index: int, model_output: torch.Tensor, sample: torch.Tensor
    ) -> torch.Tensor:
        """z_r = z_t - (sigma_t - sigma_r) * u, computed in float64 and rounded once to the model's dtype."""
        check_index(state.schedule, index)
        sigmas = state.schedule.sigmas.to(sample.device)
        # A 1-element tensor, not a 0-dim one, so type promotion lifts the update to float64 as in the reference.
        interval = (sigmas[index] - sigmas[index + 1]).reshape([1] * model_output.ndim)
        return (sample - interval * model_output).to(model_output.dtype)
