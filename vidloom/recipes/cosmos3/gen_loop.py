"""Cosmos3's denoise loop: prefill each CFG branch's text prefix once, then denoise only the generated tokens.

Plans, in order: one "prefix_prefill" per branch (conditional, then unconditional when guidance
is on), each writing its prefix's per-layer K/V into a buffer allocated from the runtime's cache
manager (released when the loop ends, however it ends); then one "denoise" plan per sampler step,
running the vision (and sound) tokens of both branches against their cached prefixes. With
`cache_prefix=False` every step re-runs the prefixes first, as the reference pipeline does (same
numbers, more work): the cached-vs-recompute test and the benchmark use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.errors import NonFiniteOutput
from vidloom.core.loop import DONE, NETWORK, Done, LoopContext, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.sampler import Sampler, SamplerConfig, Schedule, make_sampler
from vidloom.models.cosmos3.generation import Cosmos3Generator, GenConditioning
from vidloom.models.cosmos3.layout import GenLayout, text_prefix_positions
from vidloom.models.cosmos3.transformer import Cosmos3Transformer

PREFILL, DENOISE = "prefix_prefill", "denoise"


@dataclass(frozen=True)
class Branch:
    """One CFG branch: its prompt ids and the layout of its generated tokens (positions follow the prompt)."""

    ids: Tensor  # [L] long
    layout: GenLayout


def prefill(generator: Cosmos3Generator, backbone: Cosmos3Transformer, branch: Branch, out: Tensor) -> Tensor:
    positions = text_prefix_positions(len(branch.ids), generator.config)
    return generator.prefill(backbone, branch.ids, positions, out)


class Cosmos3Network:
    """The network a denoise step calls once per CFG branch: (prefix, layout, latents, timestep, sound) ->
    (vision, sound) velocities; the shared backbone is bound here, never copied."""

    def __init__(self, generator: Cosmos3Generator, backbone: Cosmos3Transformer) -> None:
        self.generator, self.backbone = generator, backbone

    def __call__(self, prefix: Tensor, layout: GenLayout, latents: Tensor, timestep: Tensor,
                 sound: Tensor | None) -> tuple[Tensor, Tensor | None]:
        x, cond = self.embed(prefix, layout, latents, timestep, sound)
        return self.head(self.run_blocks(x, cond), cond)

    # The staged denoiser contract (core.denoiser.StagedDenoiser); __call__ is their composition.

    @property
    def num_blocks(self) -> int:
        return self.generator.num_blocks

    def embed(self, prefix: Tensor, layout: GenLayout, latents: Tensor, timestep: Tensor,
              sound: Tensor | None) -> tuple[Tensor, GenConditioning]:
        return self.generator.embed(self.backbone, prefix, layout, latents, timestep, sound)

    def run_blocks(self, x: Tensor, cond: GenConditioning, start: int = 0, end: int | None = None) -> Tensor:
        return self.generator.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: GenConditioning, index: int = 0) -> Tensor:
        return self.generator.block_input(x, cond, index)

    def head(self, x: Tensor, cond: GenConditioning) -> tuple[Tensor, Tensor | None]:
        return self.generator.head(x, cond)


def denoise_step(network: Cosmos3Network, generator: Cosmos3Generator, backbone: Cosmos3Transformer,
                 branches: tuple[Branch, ...], prefixes: tuple[Tensor, ...] | None, latents: Tensor,
                 sound: Tensor | None, timestep: Tensor, guidance_scale: float) -> tuple[Tensor, Tensor | None]:
    """Guided velocities (vision [C, T, h, w], sound [C_s, T_s] or None) in float32, as the reference combines them.

    `network` runs the generated tokens (a step cache may stand in for it); `generator` and `backbone`
    recompute the prefixes when they are not cached."""
    outs = []
    for k, branch in enumerate(branches):
        if prefixes is None:  # recompute: the prefix again, this step
            prefix = prefill(generator, backbone, branch, latents.new_empty(generator.prefix_shape(len(branch.ids))))
        else:
            prefix = prefixes[k]
        vision, audio = network(prefix, branch.layout, latents, timestep, sound)
        outs.append((vision.float(), None if audio is None else audio.float()))
    (cond_v, cond_s), *rest = outs
    if not rest:
        return cond_v, cond_s
    uncond_v, uncond_s = rest[0]
    vision = uncond_v + guidance_scale * (cond_v - uncond_v)
    audio = None if cond_s is None else uncond_s + guidance_scale * (cond_s - uncond_s)
    return vision, audio


@dataclass
class Cosmos3DenoiseState:
    """One request's denoising; the prefix buffers are this request's, from the cache manager."""

    branches: tuple[Branch, ...]
    latents: Tensor  # [C, T, h, w] float32 (clean conditioning frames in place)
    sound: Tensor | None  # [C_s, T_s] float32
    sampler: Sampler
    schedule: Schedule
    sampler_state: Any
    sound_state: Any
    guidance_scale: float
    prefixes: list[Tensor] = field(default_factory=list)
    filled: int = 0  # branches prefilled so far
    index: int = 0
    pending: str = ""


class Cosmos3DenoiseLoop:
    """UniPC over the generation pathways of one resident backbone + generator."""

    name = DENOISE

    def __init__(self, backbone: Cosmos3Transformer, generator: Cosmos3Generator, sampler_config: SamplerConfig,
                 dtype: torch.dtype, cache_prefix: bool = True) -> None:
        self.backbone, self.generator = backbone, generator
        self.sampler_config, self.dtype, self.cache_prefix = sampler_config, dtype, cache_prefix
        self.network = Cosmos3Network(generator, backbone)  # holds no per-request state: shared by requests

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> Cosmos3DenoiseState:
        request: GenerationRequest = slots["request"]
        sampler = make_sampler(request.sampler, self.sampler_config.with_shift(request.flow_shift))
        schedule = sampler.schedule(request.num_inference_steps)
        branches = tuple(Branch(ids, layout) for ids, layout in slots["branches"])
        state = Cosmos3DenoiseState(
            branches=branches, latents=slots["latents"], sound=slots["sound_latents"], sampler=sampler,
            schedule=schedule, sampler_state=sampler.init_state(schedule),
            sound_state=sampler.init_state(schedule) if slots["sound_latents"] is not None else None,
            guidance_scale=float(request.guidance_scale),
        )
        if self.cache_prefix:
            ctx.hold(state.prefixes.clear)  # drop the references too, not only the accounting
            device, element = state.latents.device, torch.empty((), dtype=self.dtype).element_size()
            for branch in branches:
                shape = self.generator.prefix_shape(len(branch.ids))
                state.prefixes.append(ctx.allocate(torch.Size(shape).numel() * element,
                                                   lambda s=shape: torch.empty(s, dtype=self.dtype, device=device)))
        return state

    def next(self, state: Cosmos3DenoiseState) -> StepPlan | Done:
        if self.cache_prefix and state.filled < len(state.branches):
            k = state.filled
            state.pending = PREFILL
            return StepPlan(loop=PREFILL, index=k, total=len(state.branches), call=prefill,
                            inputs={"generator": self.generator, "backbone": self.backbone,
                                    "branch": state.branches[k], "out": state.prefixes[k]})
        if state.index >= state.schedule.num_steps:
            return DONE
        state.pending = DENOISE
        return StepPlan(
            loop=DENOISE, index=state.index, total=state.schedule.num_steps, call=denoise_step,
            inputs={NETWORK: self.network, "generator": self.generator, "backbone": self.backbone,
                    "branches": state.branches,
                    "prefixes": tuple(state.prefixes) if self.cache_prefix else None,
                    "latents": state.latents.to(self.dtype),
                    "sound": None if state.sound is None else state.sound.to(self.dtype),
                    "timestep": state.schedule.timesteps[state.index], "guidance_scale": state.guidance_scale},
        )

    def advance(self, state: Cosmos3DenoiseState, result: Any) -> Cosmos3DenoiseState:
        if state.pending == PREFILL:
            state.filled += 1
            return state
        vision, audio = result
        i = state.index
        # The reference steps a leading batch axis of one; the sampler is shape-agnostic.
        state.latents = state.sampler.step(state.sampler_state, i, vision[None], state.latents[None])[0]
        if state.sound is not None:
            state.sound = state.sampler.step(state.sound_state, i, audio[None], state.sound[None])[0]
        state.index += 1
        return state

    def finalize(self, state: Cosmos3DenoiseState) -> dict[str, Any]:
        state.prefixes.clear()
        if not torch.isfinite(state.latents).all():
            raise NonFiniteOutput.of(DENOISE, self.dtype)
        return {"latents": state.latents, "sound_latents": state.sound}
