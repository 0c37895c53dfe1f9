"""The steps of an image loop whose body is a guidance policy over packed tokens (Flux2, Qwen-Image): flow-match
Euler on float32 latents, the network called at t = sigma (the pipelines pass sigma * 1000 and divide by 1000 again,
float32 both ways)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from vidloom.core.denoiser import GUIDANCE_INPUTS
from vidloom.core.errors import NonFiniteOutput
from vidloom.core.loop import DONE, NETWORK, Done, StepPlan


@dataclass
class GuidedEulerState:
    """One request's denoising; owned by that request alone."""

    latents: Tensor  # float32 [B, N, C] packed tokens
    sigmas: Tensor  # float32 [steps + 1]
    network: Any  # the request's view of the shared transformer (a core.denoiser network)
    prompt_embeds: Tensor
    negative_embeds: Tensor | None  # None: no CFG
    guidance_scale: float
    index: int = 0


class GuidedEulerSteps:
    """next / advance / finalize of such a loop; the family's loop gives `name`, `schedule` (its
    `num_train_timesteps`), `guidance` (the step body) and `dtype` (the transformer's), and builds the state."""

    name: str
    schedule: Any
    guidance: Any
    dtype: torch.dtype

    def next(self, state: GuidedEulerState) -> StepPlan | Done:
        total = len(state.sigmas) - 1
        if state.index >= total:
            return DONE
        t = state.sigmas[state.index] * self.schedule.num_train_timesteps
        timestep = (t.expand(state.latents.shape[0]).to(state.latents.dtype) / 1000).to(state.latents.device)
        return StepPlan(
            loop=self.name, index=state.index, total=total, call=self.guidance, denoiser=GUIDANCE_INPUTS,
            inputs={
                NETWORK: state.network,
                "latents": state.latents.to(self.dtype),
                "timestep": timestep,
                "prompt_embeds": state.prompt_embeds,
                "negative_embeds": state.negative_embeds,
                "guidance_scale": state.guidance_scale,
            },
        )

    def advance(self, state: GuidedEulerState, result: Tensor) -> GuidedEulerState:
        dt = (state.sigmas[state.index + 1] - state.sigmas[state.index]).to(state.latents.device)
        state.latents = state.latents + dt * result.float()
        state.index += 1
        return state

    def finalize(self, state: GuidedEulerState) -> dict[str, Any]:
        if not torch.isfinite(state.latents).all():
            raise NonFiniteOutput.of("denoising", self.dtype)
        return {"latents": state.latents}
