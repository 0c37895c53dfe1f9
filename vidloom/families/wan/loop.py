"""Wan's denoise loop: one plan per sampler step; the step body is a CFG policy over the DiT.

The same loop runs every Wan variant: plain T2V, Wan2.1 I2V (condition channels appended and
CLIP tokens bound to the network), Wan2.2 TI2V (per-token timesteps, clean first frame) and the
Wan2.2 A14B mixture (the expert, and its guidance scale, chosen per step by the boundary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from vidloom.core.denoiser import GUIDANCE_INPUTS
from vidloom.core.errors import NonFiniteOutput
from vidloom.core.loop import DONE, NETWORK, Done, LoopContext, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import GuidancePolicy, SequentialCFG
from vidloom.diffusion.prompt_kv import PreparedPrompts
from vidloom.diffusion.sampler import Sampler, SamplerConfig, Schedule, make_sampler
from vidloom.runtime.prompt_buckets import prompt_bucket
from vidloom.models.wan.transformer import WanTransformer
from vidloom.families.wan.experts import ExpertPlacement, PlacedNetwork
from vidloom.families.wan.conditioning import (
    ImageConditionedNetwork,
    WanPipelineConfig,
    keep_first_frame,
    noise_to,
    token_timesteps,
    v2v_start,
)

HIGH_NOISE, LOW_NOISE = "transformer", "transformer_2"  # expert names, as the checkpoint's folders
ONE_STAGE = WanPipelineConfig()  # Wan2.1: one expert, one timestep per sample


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
    guidance_scale_2: float  # the low-noise expert's scale (two-expert checkpoints)
    networks: Mapping[str, Any]  # expert name -> the network its steps call (image tokens bound per request)
    prompts: PreparedPrompts  # every expert's and branch's prompt (and I2V image) keys/values, prepared on first use
    condition: torch.Tensor | None = None  # Wan2.1 I2V channels appended / TI2V first-frame latents
    frame_mask: torch.Tensor | None = None  # TI2V: [1, 1, T, h, w], 0 where the frame is kept clean
    index: int = 0
    start: int = 0  # first step taken (video-to-video skips the noisiest part of the schedule)


class WanDenoiseLoop:
    """Flow-matching denoise loop over shared WanTransformer experts (one, or two for Wan2.2 A14B)."""

    name = "denoise"

    def __init__(
        self,
        transformer: WanTransformer,
        sampler_config: SamplerConfig,
        dtype: torch.dtype,
        guidance: GuidancePolicy | None = None,
        transformer_2: WanTransformer | None = None,
        pipeline: WanPipelineConfig = ONE_STAGE,
        placement: ExpertPlacement | None = None,
        prepare_prompts: bool = True,
    ) -> None:
        """`placement` (deploy.offload_idle_expert): experts are made resident on the device as they run.
        `prepare_prompts`: the blocks' prompt keys/values are projected once per request, expert and CFG branch, an
        I2V request's image keys/values once per request and expert (diffusion.prompt_kv); False projects them at
        every step (the reference's order, for comparisons)."""
        self.transformer = transformer
        self.transformer_2 = transformer_2
        self.sampler_config = sampler_config
        self.dtype = dtype
        self.guidance = guidance or SequentialCFG()
        self.pipeline = pipeline
        self.placement = placement
        self.prepare_prompts = prepare_prompts
        if (transformer_2 is None) != (pipeline.boundary_ratio is None):
            raise ValueError("a second expert needs boundary_ratio, and boundary_ratio a second expert")

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> WanDenoiseState:
        request: GenerationRequest = slots["request"]
        sampler = make_sampler(request.sampler, self.sampler_config.with_shift(request.flow_shift))
        schedule = sampler.schedule(request.num_inference_steps)
        negative = slots["negative_embeds"]
        guidance = float(request.guidance_scale)
        latents, start = slots["latents"], 0
        if slots.get("video_latents") is not None:  # V2V: the input video, noised to the first step's sigma
            start = v2v_start(request.num_inference_steps, float(request.option("strength")))
            latents = noise_to(slots["video_latents"], latents, schedule.sigmas[start])
        return WanDenoiseState(
            latents=latents,
            sampler=sampler,
            schedule=schedule,
            sampler_state=sampler.init_state(schedule, start, slots.get("generator")),
            index=start,
            start=start,
            prompt_embeds=slots["prompt_embeds"].to(self.dtype),
            negative_embeds=None if negative is None else negative.to(self.dtype),
            guidance_scale=guidance,
            guidance_scale_2=guidance if request.option("guidance_scale_2") is None else float(request.option("guidance_scale_2")),
            networks=self._networks(slots.get("image_embeds")),
            prompts=PreparedPrompts(self.prepare_prompts, prompt_bucket(ctx)),
            condition=slots.get("condition"),
            frame_mask=slots.get("frame_mask"),
        )

    def _networks(self, image_embeds: torch.Tensor | None) -> dict[str, Any]:
        experts: dict[str, Any] = {HIGH_NOISE: self.transformer}
        if self.transformer_2 is not None:
            experts[LOW_NOISE] = self.transformer_2
        if self.placement is not None:
            experts = {name: PlacedNetwork(self.placement, name, net) for name, net in experts.items()}
        if image_embeds is None:
            return experts  # the shared modules themselves: CUDA graphs capture them by identity
        embeds = image_embeds.to(self.dtype)
        return {name: ImageConditionedNetwork(net, embeds) for name, net in experts.items()}

    def expert_for(self, timestep: torch.Tensor) -> str:
        """Which expert denoises at `timestep`: the high-noise one at and above the boundary (diffusers' rule)."""
        ratio = self.pipeline.boundary_ratio
        if ratio is None or float(timestep) >= ratio * self.sampler_config.num_train_timesteps:
            return HIGH_NOISE
        return LOW_NOISE

    def next(self, state: WanDenoiseState) -> StepPlan | Done:
        total = len(state.schedule.timesteps)
        if state.index >= total:
            return DONE
        t = state.schedule.timesteps[state.index].to(state.latents.device)
        expert = self.expert_for(t)
        latents, timestep = self._model_input(state, t)
        network = state.prompts.network(state.networks[expert])  # I2V: the image K/V, once per request
        return StepPlan(
            loop=self.name,
            index=state.index - state.start,  # steps of this run (V2V runs only the tail of the schedule)
            total=total - state.start,
            call=self.guidance,
            denoiser=GUIDANCE_INPUTS,
            inputs={
                NETWORK: network,
                "latents": latents,
                "timestep": timestep,
                "prompt_embeds": state.prompts.get(network, state.prompt_embeds),
                "negative_embeds": state.prompts.get(network, state.negative_embeds),
                "guidance_scale": state.guidance_scale if expert == HIGH_NOISE else state.guidance_scale_2,
            },
            expert=expert if self.transformer_2 is not None else None,
        )

    def _model_input(self, state: WanDenoiseState, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The DiT's latents (dtype) and timestep ([B], or [B, S] per token) for this step."""
        batch = state.latents.shape[0]
        if self.pipeline.expand_timesteps:
            mask = state.frame_mask if state.frame_mask is not None else torch.ones_like(state.latents[:, :1])
            latents = state.latents
            if state.condition is not None:
                latents = keep_first_frame(latents, state.condition, mask)
            return latents.to(self.dtype), token_timesteps(mask, t, self.transformer.config.patch_size, batch)
        latents = state.latents
        if state.condition is not None:
            latents = torch.cat([latents, state.condition.expand(batch, -1, -1, -1, -1)], dim=1)
        return latents.to(self.dtype), t.expand(batch)

    def advance(self, state: WanDenoiseState, result: torch.Tensor) -> WanDenoiseState:
        state.latents = state.sampler.step(state.sampler_state, state.index, result, state.latents)
        state.index += 1
        return state

    def finalize(self, state: WanDenoiseState) -> dict[str, Any]:
        latents = state.latents
        if self.pipeline.expand_timesteps and state.condition is not None and state.frame_mask is not None:
            latents = keep_first_frame(latents, state.condition, state.frame_mask)
        # One check per request (not per step): a NaN anywhere propagates to the end.
        if not torch.isfinite(latents).all():
            raise NonFiniteOutput.of("denoising", self.dtype)
        state.prompts.clear()
        return {"latents": latents}
