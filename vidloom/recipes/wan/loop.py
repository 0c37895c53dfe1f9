"""Wan's denoise loop: one plan per sampler step; the step body is a CFG policy over the DiT."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from vidloom.core.errors import NonFiniteOutput
from vidloom.core.loop import DONE, NETWORK, Done, LoopContext, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import GuidancePolicy, SequentialCFG
from vidloom.diffusion.sampler import Sampler, SamplerConfig, Schedule, make_sampler
from vidloom.models.wan.transformer import WanTransformer


@dataclass
class WanDenoiseState:
    """Everything one request's denoising needs; owned by that request alone."""

    latents: torch.Tensor  # float32 [B, C, T, h, w]; the sampler works in float32
    sampler: Sampler
    schedule: Schedule
    sampler_state: Any
    prompt_embeds: torch.Tensor
    negative_embeds: torch.Tensor | None  # None when CFG is off
    guidance_scale: float
    index: int = 0


class WanDenoiseLoop:
    """Flow-matching denoise loop over a shared WanTransformer."""

    name = "denoise"

    def __init__(
        self,
        transformer: WanTransformer,
        sampler_config: SamplerConfig,
        dtype: torch.dtype,
        guidance: GuidancePolicy | None = None,
    ) -> None:
        self.transformer = transformer
        self.sampler_config = sampler_config
        self.dtype = dtype
        self.guidance = guidance or SequentialCFG()

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> WanDenoiseState:
        request: GenerationRequest = slots["request"]
        sampler = make_sampler(request.sampler, self.sampler_config.with_shift(request.flow_shift))
        schedule = sampler.schedule(request.num_inference_steps)
        return WanDenoiseState(
            latents=slots["latents"],
            sampler=sampler,
            schedule=schedule,
            sampler_state=sampler.init_state(schedule),
            prompt_embeds=slots["prompt_embeds"].to(self.dtype),
            negative_embeds=None if slots["negative_embeds"] is None else slots["negative_embeds"].to(self.dtype),
            guidance_scale=float(request.guidance_scale),
        )

    def next(self, state: WanDenoiseState) -> StepPlan | Done:
        total = len(state.schedule.timesteps)
        if state.index >= total:
            return DONE
        t = state.schedule.timesteps[state.index].to(state.latents.device)
        return StepPlan(
            loop=self.name,
            index=state.index,
            total=total,
            call=self.guidance,
            inputs={
                NETWORK: self.transformer,
                "latents": state.latents.to(self.dtype),
                "timestep": t.expand(state.latents.shape[0]),
                "prompt_embeds": state.prompt_embeds,
                "negative_embeds": state.negative_embeds,
                "guidance_scale": state.guidance_scale,
            },
        )

    def advance(self, state: WanDenoiseState, result: torch.Tensor) -> WanDenoiseState:
        state.latents = state.sampler.step(state.sampler_state, state.index, result, state.latents)
        state.index += 1
        return state

    def finalize(self, state: WanDenoiseState) -> dict[str, Any]:
        # One check per request (not per step): a NaN anywhere propagates to the end.
        if not torch.isfinite(state.latents).all():
            raise NonFiniteOutput("denoising produced NaN/inf latents (try float32 or bfloat16 instead of float16)")
        return {"latents": state.latents}
