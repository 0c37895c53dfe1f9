"""Cosmos3's denoise loop: prefill each CFG branch's text prefix once, then denoise only the generated tokens.

Plans, in order: one "prefix_prefill" per branch (conditional, then unconditional when guidance
is on), each writing its prefix's per-layer K/V into a buffer allocated from the runtime's cache
manager (released when the loop ends, however it ends); then one "denoise" plan per sampler step,
running the vision (sound, action) tokens of both branches against their cached prefixes. The action
stream has its own sampler state (the reference steps a copy of the scheduler for it) and is stepped only
when some of its steps are noisy (not in forward dynamics, where the actions are given). With
`cache_prefix=False` every step re-runs the prefixes first, as the reference pipeline does (same
numbers, more work): the cached-vs-recompute test and the benchmark use it.

Under --cfg-parallel (`pair`) every rank still prefills both branches' prefixes (as every rank of a pool encodes
both prompts: the ranks' step inputs stay identical, and a prefill is once per request), then each step runs only
its rank's branch (conditional on cfg-rank 0) and the pair exchanges predictions and combines them alike.

A denoise plan declares its per-request inputs (gen_step.STEP_INPUTS) and a per-request network view over the
request's prefixes (gen_step.Cosmos3View), so under `--policy batch` steps of requests whose prompts have equal token
counts (and equal generated layouts) run as one forward; the rest run alone (gen_step says why).

Under cuda_graphs (ctx.captures_steps) each branch's prefix buffer is padded to its prompt-length bucket and is a
static buffer of that bucket (gen_step.PaddedPrefix; reuse key: the branch, its padded shape, dtype and device): the
prefill writes the prompt's rows, the steps read the whole buffer with the padding masked out, and the next request of
the bucket takes the buffer over and replays the steps' graphs. An action session's prefixes stay resident between
its chunks, which a buffer handed to the next request cannot: a request of a session keeps unpadded prefixes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.errors import NonFiniteOutput
from vidloom.core.loop import DONE, NETWORK, Done, LoopContext, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import BranchExchange
from vidloom.diffusion.sampler import Sampler, SamplerConfig, Schedule, make_sampler
from vidloom.families.cosmos3.gen_step import (PREFILL_INPUTS, STEP_INPUTS, Branch, Cosmos3View, PaddedPrefix,
                                               denoise_step, prefill_step)
from vidloom.families.cosmos3.generation import ActionTokens, Cosmos3Generator
from vidloom.families.cosmos3.transformer import Cosmos3Transformer
from vidloom.runtime.prompt_buckets import bucket_length

PREFILL, DENOISE = "prefix_prefill", "denoise"


@dataclass
class ResidentPrefix:
    """An action session's prefilled prefixes, kept in the cache manager between its chunks: every chunk of a
    session has the same caption (same canvas, length and fps), so the same prompt ids and prefix K/V."""

    ids: tuple[tuple[int, ...], ...]
    prefixes: list[Tensor]
    complete: bool = False  # set once every branch is prefilled (a run cancelled mid-prefill leaves it False)


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
    actions: Tensor | None = None  # [T_a, action_dim] float32 (clean conditioning steps in place)
    action_state: Any = None
    domain: int = 0
    action_width: int = 0  # the embodiment's unpadded width
    prefixes: list[Tensor] = field(default_factory=list)
    slabs: list[PaddedPrefix] = field(default_factory=list)  # under cuda_graphs: the padded buffers `prefixes` view
    prefix_masks: list[Tensor] = field(default_factory=list)  # under cuda_graphs: [bucket] bool, True at prompt rows
    resident: ResidentPrefix | None = None  # kept for the next chunk of an action session
    filled: int = 0  # branches prefilled so far
    index: int = 0
    pending: str = ""


class Cosmos3DenoiseLoop:
    """UniPC over the generation pathways of one resident backbone + generator."""

    name = DENOISE

    def __init__(self, backbone: Cosmos3Transformer, generator: Cosmos3Generator, sampler_config: SamplerConfig,
                 dtype: torch.dtype, cache_prefix: bool = True, pair: BranchExchange | None = None) -> None:
        self.backbone, self.generator = backbone, generator
        self.sampler_config, self.dtype, self.cache_prefix = sampler_config, dtype, cache_prefix
        self.pair = pair  # a --cfg-parallel pair: one branch per rank

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> Cosmos3DenoiseState:
        request: GenerationRequest = slots["request"]
        sampler = make_sampler(request.sampler, self.sampler_config.with_shift(request.flow_shift))
        schedule = sampler.schedule(request.num_inference_steps)
        branches = tuple(Branch.of(ids, layout) for ids, layout in slots["branches"])
        state = Cosmos3DenoiseState(
            branches=branches, latents=slots["latents"], sound=slots["sound_latents"], sampler=sampler,
            schedule=schedule, sampler_state=sampler.init_state(schedule),
            sound_state=sampler.init_state(schedule) if slots["sound_latents"] is not None else None,
            guidance_scale=float(request.guidance_scale),
        )
        if slots["action_latents"] is not None:
            state.actions, state.action_state = slots["action_latents"], sampler.init_state(schedule)
            state.domain, state.action_width = request.option("action").domain_id, request.option("action").raw_width
        if self.cache_prefix:
            ctx.hold(state.prefixes.clear)  # drop the references too, not only the accounting
            session = getattr(request.option("action"), "session_id", None)
            if session is not None and self._resume(state, ctx, session):
                return state
            if session is None and ctx.captures_steps:
                self._padded(state, ctx)
                return state
            device, element = state.latents.device, torch.empty((), dtype=self.dtype).element_size()
            for branch in branches:
                shape = self.generator.prefix_shape(len(branch.ids))
                state.prefixes.append(ctx.allocate(torch.Size(shape).numel() * element,
                                                   lambda s=shape: torch.zeros(s, dtype=self.dtype, device=device)))
            if session is not None:
                self._keep(state, ctx)
        return state

    def _padded(self, state: Cosmos3DenoiseState, ctx: LoopContext) -> None:
        """Each branch's prefix in a static buffer padded to its prompt-length bucket, its layout's step inputs on the
        device (gen_step's module docstring)."""
        ctx.hold(state.slabs.clear)
        ctx.hold(state.prefix_masks.clear)
        device, element = state.latents.device, torch.empty((), dtype=self.dtype).element_size()
        for k, branch in enumerate(state.branches):
            padded = bucket_length(len(branch.ids))
            shape = self.generator.prefix_shape(padded)
            slab = ctx.allocate(torch.Size(shape).numel() * element,
                                lambda s=shape: PaddedPrefix(torch.zeros(s, dtype=self.dtype, device=device)),
                                reuse=(k, shape, self.dtype, device))
            state.slabs.append(slab)
            state.prefixes.append(slab.kv)
            state.prefix_masks.append(torch.arange(padded, device=device) < len(branch.ids))
        state.branches = tuple(dataclasses.replace(b, layout=b.layout.on(device)) for b in state.branches)

    def _filled(self, state: Cosmos3DenoiseState, k: int) -> Tensor:
        """The rows of branch `k`'s prefix buffer its prefill writes: all of them, or the prompt's of a padded one."""
        buffer = state.prefixes[k]
        return buffer if not state.slabs else buffer.narrow(-3, 0, len(state.branches[k].ids))

    @staticmethod
    def _ids(state: Cosmos3DenoiseState) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(branch.ids.tolist()) for branch in state.branches)

    def _resume(self, state: Cosmos3DenoiseState, ctx: LoopContext, session: str) -> bool:
        """Reuse the session's resident prefixes (pinned for this run) when they were made for these ids."""
        resident = ctx.session(session)
        if not isinstance(resident, ResidentPrefix) or not resident.complete or resident.ids != self._ids(state):
            return False
        state.prefixes.extend(resident.prefixes)
        state.filled = len(state.branches)
        return True

    def _keep(self, state: Cosmos3DenoiseState, ctx: LoopContext) -> None:
        """Keep this chunk's prefixes resident for the session's next chunk (when the deployment keeps sessions)."""
        nbytes = sum(p.numel() * p.element_size() for p in state.prefixes)
        resident = ResidentPrefix(self._ids(state), list(state.prefixes))
        if ctx.keep_session(nbytes, lambda: resident):
            state.resident = resident

    def next(self, state: Cosmos3DenoiseState) -> StepPlan | Done:
        if self.cache_prefix and state.filled < len(state.branches):
            k = state.filled
            state.pending = PREFILL
            return StepPlan(loop=PREFILL, index=k, total=len(state.branches), call=prefill_step,
                            denoiser=PREFILL_INPUTS,
                            inputs={"generator": self.generator, "backbone": self.backbone,
                                    "ids": state.branches[k].ids[None], "out": self._filled(state, k)[None]})
        if state.index >= state.schedule.num_steps:
            return DONE
        state.pending = DENOISE
        # One request's prefixes as a batch of one (views of its buffers, no copy): batched steps stack them.
        prefixes = tuple(p[None] for p in state.prefixes) if self.cache_prefix else None
        padded = (tuple(state.prefix_masks), tuple(state.slabs)) if state.slabs else (None, None)
        return StepPlan(
            loop=DENOISE, index=state.index, total=state.schedule.num_steps, call=denoise_step, denoiser=STEP_INPUTS,
            inputs={NETWORK: Cosmos3View(self.generator, self.backbone, state.branches, prefixes, *padded),
                    "branches": len(state.branches),
                    "latents": state.latents.to(self.dtype)[None],
                    "sound": None if state.sound is None else state.sound.to(self.dtype)[None],
                    "timestep": state.schedule.timesteps[state.index].reshape(1),
                    "guidance_scale": state.guidance_scale,
                    "action": None if state.actions is None else ActionTokens(state.actions.to(self.dtype)[None],
                                                                              state.domain),
                    "action_width": state.action_width, "cfg_pair": self.pair},
        )

    def advance(self, state: Cosmos3DenoiseState, result: Any) -> Cosmos3DenoiseState:
        if state.pending == PREFILL:
            buffer = self._filled(state, state.filled)
            if result.data_ptr() != buffer.data_ptr():  # a batched prefill wrote a stacked copy: this request's rows
                buffer.copy_(result[0])
            state.filled += 1
            if state.resident is not None and state.filled == len(state.branches):
                state.resident.complete = True
            return state
        vision, audio, acts = result  # each with this request's batch axis of one, as the reference steps them
        i = state.index
        state.latents = state.sampler.step(state.sampler_state, i, vision, state.latents[None])[0]
        if state.sound is not None:
            state.sound = state.sampler.step(state.sound_state, i, audio, state.sound[None])[0]
        if state.actions is not None and state.branches[0].layout.action_noisy:
            state.actions = state.sampler.step(state.action_state, i, acts, state.actions[None])[0]
            state.actions[:, state.action_width:] = 0
        state.index += 1
        return state

    def finalize(self, state: Cosmos3DenoiseState) -> dict[str, Any]:
        state.prefixes.clear()
        if not torch.isfinite(state.latents).all():
            raise NonFiniteOutput.of(DENOISE, self.dtype)
        return {"latents": state.latents, "sound_latents": state.sound, "action_latents": state.actions}
