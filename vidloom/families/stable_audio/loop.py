"""Stable Audio's denoise loop: the cosine DPM-solver++ SDE over audio latents; the step body is a CFG policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.denoiser import GUIDANCE_INPUTS
from vidloom.core.errors import NonFiniteOutput
from vidloom.core.loop import DONE, NETWORK, Done, LoopContext, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.diffusion import cosine_dpm
from vidloom.diffusion.cosine_dpm import CosineDPMConfig, CosineDPMState
from vidloom.diffusion.guidance import GuidancePolicy, SequentialCFG
from vidloom.diffusion.prompt_kv import PreparedPrompts
from vidloom.families.stable_audio.transformer import StableAudioConditioning, StableAudioDiT
from vidloom.layers.prompt_kv import PromptKV


class StableAudioNetwork:
    """(scaled latents, noise level, text tokens) -> v-prediction, for one request (or requests stacked).

    Holds the request's global token (its start and end seconds), so it never lives on the shared DiT.
    """

    def __init__(self, transformer: StableAudioDiT, global_states: Tensor) -> None:
        self.transformer = transformer
        self.global_states = global_states  # [1, 1, global_states_input_dim]

    def batch_key(self) -> tuple[Any, ...]:
        """Networks with equal keys stack (runtime.batching): every request runs the model's one window, so the
        shared DiT is the whole key; the duration tokens stack along the batch."""
        return (id(self.transformer),)

    @staticmethod
    def stack(views: list[StableAudioNetwork]) -> StableAudioNetwork:
        return StableAudioNetwork(views[0].transformer, torch.cat([v.global_states for v in views], dim=0))

    def graph_split(self) -> tuple[Any, tuple[Tensor]]:
        """core.denoiser.GraphInputs: a captured step reads this request's duration token."""
        return id(self.transformer), (self.global_states,)

    def graph_rebuild(self, parts: tuple[Tensor]) -> StableAudioNetwork:
        return StableAudioNetwork(self.transformer, parts[0])

    def __call__(self, latents: Tensor, timestep: Tensor, text: Tensor | PromptKV) -> Tensor:
        stream, cond = self.embed(latents, timestep, text)
        return self.head(self.run_blocks(stream, cond), cond)

    # The staged denoiser contract (core.denoiser.StagedDenoiser): __call__ is exactly their composition, so
    # step caches and compiled blocks act on Stable Audio as on every other family.

    @property
    def num_blocks(self) -> int:
        return self.transformer.num_blocks

    def embed(self, latents: Tensor, timestep: Tensor, text: Tensor | PromptKV) -> tuple[Tensor, StableAudioConditioning]:
        # A stacked network's B tokens serve B latents; batched CFG repeats that batch ([cond rows, uncond rows]).
        glob = self.global_states.repeat(latents.shape[0] // self.global_states.shape[0], 1, 1)
        return self.transformer.embed(latents, timestep, text, glob)

    def run_blocks(self, x: Tensor, cond: StableAudioConditioning, start: int = 0, end: int | None = None) -> Tensor:
        return self.transformer.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: StableAudioConditioning, index: int = 0) -> Tensor:
        return self.transformer.block_input(x, cond, index)

    def head(self, x: Tensor, cond: StableAudioConditioning) -> Tensor:
        return self.transformer.head(x, cond)


@dataclass
class StableAudioDenoiseState:
    """One request's denoising; owned by that request alone."""

    latents: Tensor  # float32 [1, C, sample_size]
    sampler: CosineDPMState
    network: StableAudioNetwork
    prompt_embeds: Tensor  # [1, L + 2, D]: text tokens, then the start and end tokens
    negative_embeds: Tensor | None  # None when CFG is off
    guidance_scale: float
    prompts: PreparedPrompts = field(default_factory=PreparedPrompts)  # each branch's prompt K/V, once per request


class StableAudioDenoiseLoop:
    name = "denoise"

    def __init__(self, transformer: StableAudioDiT, sampler: CosineDPMConfig, dtype: torch.dtype,
                 guidance: GuidancePolicy | None = None) -> None:
        self.transformer = transformer
        self.sampler = sampler
        self.dtype = dtype
        self.guidance = guidance or SequentialCFG()

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> StableAudioDenoiseState:
        request: GenerationRequest = slots["request"]
        negative = slots["negative_embeds"]
        return StableAudioDenoiseState(
            latents=slots["latents"],
            sampler=cosine_dpm.start(self.sampler, request.num_inference_steps, request.seed),
            network=StableAudioNetwork(self.transformer, slots["global_states"].to(self.dtype)),
            prompt_embeds=slots["prompt_embeds"].to(self.dtype),
            negative_embeds=None if negative is None else negative.to(self.dtype),
            guidance_scale=float(request.guidance_scale),
        )

    def next(self, state: StableAudioDenoiseState) -> StepPlan | Done:
        s = state.sampler
        if s.index >= s.steps:
            return DONE
        sigma = s.sigmas[s.index]
        device = state.latents.device
        return StepPlan(
            loop=self.name,
            index=s.index,
            total=s.steps,
            call=self.guidance,
            denoiser=GUIDANCE_INPUTS,
            inputs={
                NETWORK: state.network,
                "latents": self.sampler.scale_input(state.latents, sigma.to(device)).to(self.dtype),
                "timestep": self.sampler.noise_level(sigma).unsqueeze(0).to(device),
                "prompt_embeds": state.prompts.get(self.transformer, state.prompt_embeds),
                "negative_embeds": state.prompts.get(self.transformer, state.negative_embeds),
                "guidance_scale": state.guidance_scale,
            },
        )

    def advance(self, state: StableAudioDenoiseState, result: Tensor) -> StableAudioDenoiseState:
        state.latents = cosine_dpm.step(self.sampler, state.sampler, result.float(), state.latents)
        return state

    def finalize(self, state: StableAudioDenoiseState) -> dict[str, Any]:
        if not torch.isfinite(state.latents).all():
            raise NonFiniteOutput.of("denoising", self.dtype)
        return {"latents": state.latents}
