"""AnyFlow-FAR chunk rollout: chunk by chunk, a few flow-map steps each, attending to earlier chunks.

Plans, in order, for every chunk k: a KV prefill of chunks [0, k) (none for chunk 0),
one plan per flow-map step, then (with a VAE) the decode of chunk k, whose frames go
to the caller at once through the loop context. Conditioning chunks (I2V / V2V) are
decoded first and never denoised. The KV slab comes from the runtime's cache manager
at `init` and is released when the loop ends however it ends. With `kv_cache=False`
every step recomputes the whole sequence instead (same results, no slab).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

from vidloom.core.errors import InvalidRequest, NonFiniteOutput
from vidloom.core.loop import DONE, Done, LoopContext, StepPlan
from vidloom.core.output import VideoChunk
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.flow_map_euler import FlowMapEulerSampler
from vidloom.diffusion.sampler import SamplerConfig, Schedule, make_sampler
from vidloom.models.wan.vae import WanVAE
from vidloom.models.wan.vae_stream import StreamingDecode
from vidloom.models.wan_causal.kv_cache import FarKVCache
from vidloom.models.wan_causal.layout import ChunkLayout
from vidloom.models.wan_causal.transformer import FarText, FarTransformer
from vidloom.recipes.wan_causal.decode import decode_chunk, video_frame_range

CHUNK_PHASE = "chunks"
"""Progress phase reported once per finished chunk (plan steps report under their loop names)."""
PREFILL, STEP, DECODE = "kv_prefill", "rollout", "decode"
"""Plan kinds, also their progress phases."""


def chunk_partition(latent_frames: int, default: tuple[int, ...]) -> tuple[int, ...]:
    """Latent frames per chunk: the checkpoint's partition when it fits, else the same rhythm cut to length.

    The rhythm is the default's first chunk, then chunks of its largest size, the last one shorter.
    """
    if sum(default) == latent_frames:
        return default
    first = min(default[0], latent_frames)
    size = max(default[1:], default=default[0])
    rest = latent_frames - first
    return (first, *([size] * (rest // size)), *((rest % size,) if rest % size else ()))


def far_step(
    transformer: FarTransformer, latents: Tensor, t: Tensor, r: Tensor, text: FarText, layout: ChunkLayout,
    cache: FarKVCache | None, guidance_scale: float,
) -> Tensor:
    """One flow-map prediction for the generated chunk, CFG branches batched as [uncond, cond] like the reference."""
    branches = text.batch
    x = latents.expand(branches, *latents.shape[1:])
    tt, rr = t.expand(branches), r.expand(branches)
    if cache is None:
        out = transformer.recompute(x, tt, rr, text, layout)
    else:
        out = transformer.step(x, tt, rr, text, layout, cache)
    if branches == 1:
        return out
    uncond, cond = out.chunk(2)
    return uncond + guidance_scale * (cond - uncond)


def far_prefill(transformer: FarTransformer, context: Tensor, text: FarText, layout: ChunkLayout, cache: FarKVCache) -> None:
    transformer.prefill(context.expand(text.batch, *context.shape[1:]), text, layout, cache)


@dataclass
class FarRolloutState:
    """One request's rollout; the KV slab in `cache` and the decode stream are this request's alone."""

    layouts: list[ChunkLayout]
    noise: Tensor  # [1, C, F, h, w], compute dtype
    latents: Tensor  # [1, C, F, h, w]: conditioning, then finished chunks in order
    text: FarText  # per-layer text K/V, batch = CFG branches ([uncond, cond])
    guidance_scale: float
    sampler: FlowMapEulerSampler
    schedule: Schedule
    ctx: LoopContext
    frame_starts: list[int]  # latent frame where each chunk starts, plus the end
    context_chunks: int  # leading chunks given as conditioning (I2V / V2V), never denoised
    chunk: int  # the chunk being generated (== len(layouts) when all are)
    chunk_latents: Tensor
    sampler_state: Any = None
    cache: FarKVCache | None = None
    stream: StreamingDecode | None = None
    step: int = 0
    prefilled: bool = False
    done_steps: int = 0
    reported: int = 0  # chunks reported through ctx.progress so far
    decoded: int = 0  # chunks decoded and emitted so far
    frames: list[Tensor] | None = None  # decoded chunks, [F, H, W, 3] each
    pending: str = ""  # kind of the plan `next` returned last


class FarRolloutLoop:
    """Causal chunk rollout over a shared FarTransformer (and VAE); per-request state only in FarRolloutState."""

    name = STEP

    def __init__(self, transformer: FarTransformer, sampler_config: SamplerConfig, dtype: torch.dtype,
                 kv_cache: bool = True, vae: WanVAE | None = None) -> None:
        """`vae`: decode and emit each chunk as it finishes (and write "video"); None: latents only."""
        self.transformer = transformer
        self.sampler_config = sampler_config
        self.dtype = dtype
        self.kv_cache = kv_cache
        self.vae = vae

    # -- init -------------------------------------------------------------------------

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> FarRolloutState:
        request: GenerationRequest = slots["request"]
        noise: Tensor = slots["latents"].to(self.dtype)
        sampler = make_sampler(request.sampler, self.sampler_config.with_shift(request.flow_shift))
        assert isinstance(sampler, FlowMapEulerSampler), "card lists only flow-map samplers"
        schedule = sampler.schedule(request.num_inference_steps)
        config = self.transformer.config
        partition = chunk_partition(noise.shape[2], config.chunk_partition)
        layouts = [ChunkLayout.for_chunk(partition, k, (noise.shape[3], noise.shape[4]), config)
                   for k in range(len(partition))]
        starts = [sum(partition[:k]) for k in range(len(partition) + 1)]
        latents, first = self._conditioned(noise, slots["context_latents"], starts)
        state = FarRolloutState(
            layouts=layouts, noise=noise, latents=latents, text=self.transformer.embed_text(self._branches(slots)),
            guidance_scale=float(request.guidance_scale), sampler=sampler, schedule=schedule, ctx=ctx,
            frame_starts=starts, context_chunks=first, chunk=first, reported=first,
            chunk_latents=noise[:, :, starts[first] : starts[first + 1]], sampler_state=sampler.init_state(schedule),
        )
        if self.vae is not None:
            state.stream, state.frames = StreamingDecode(self.vae), []
        if self.kv_cache:
            ctx.hold(lambda: _release(state))
            state.cache = ctx.allocate(self._cache_bytes(layouts, state.text.batch),
                                       lambda: self.transformer.new_cache(layouts, state.text.batch, noise.device, self.dtype))
        return state

    def _cache_bytes(self, layouts: list[ChunkLayout], batch: int) -> int:
        wan = self.transformer.config.wan
        return FarKVCache.bytes_needed(layouts, wan.num_layers, batch, wan.num_attention_heads,
                                       wan.attention_head_dim, self.dtype)

    def _conditioned(self, noise: Tensor, context: Tensor | None, starts: list[int]) -> tuple[Tensor, int]:
        """The output latents with the conditioning frames in place, and the first chunk to generate.

        As the reference does, every chunk that the conditioning frames reach is context
        (never denoised); frames of those chunks past the conditioning stay zero.
        """
        latents = torch.zeros_like(noise)
        if context is None:
            return latents, 0
        frames = context.shape[2]
        first = next((k for k in range(1, len(starts)) if starts[k] >= frames), len(starts))
        if first >= len(starts) - 1:
            raise InvalidRequest(
                "num_frames", f"{noise.shape[2]} latent frames are all conditioning; ask for more frames to generate"
            )
        latents[:, :, :frames] = context.to(latents.dtype)
        return latents, first

    def _branches(self, slots: Mapping[str, Any]) -> Tensor:
        negative = slots["negative_embeds"]
        embeds = slots["prompt_embeds"] if negative is None else torch.cat([negative, slots["prompt_embeds"]])
        return embeds.to(self.dtype)

    # -- plans ------------------------------------------------------------------------

    def next(self, state: FarRolloutState) -> StepPlan | Done:
        if state.reported < state.chunk:
            # Reported here rather than in advance, so it follows the runtime's event for the chunk's last step.
            state.reported = state.chunk
            state.ctx.progress(CHUNK_PHASE, state.chunk, len(state.layouts))
        plan = self._decode_plan(state) or self._prefill_plan(state) or self._step_plan(state)
        state.pending = plan.loop if isinstance(plan, StepPlan) else ""
        return plan

    def _decode_plan(self, state: FarRolloutState) -> StepPlan | None:
        if state.stream is None or state.decoded >= state.chunk:
            return None
        k = state.decoded
        latents = state.latents[:, :, state.frame_starts[k] : state.frame_starts[k + 1]]
        return StepPlan(loop=DECODE, index=k, total=len(state.layouts), call=decode_chunk,
                        inputs={"vae": self.vae, "stream": state.stream, "latents": latents})

    def _prefill_plan(self, state: FarRolloutState) -> StepPlan | None:
        if state.chunk >= len(state.layouts) or state.cache is None or state.prefilled:
            return None
        layout = state.layouts[state.chunk]
        if not layout.context_frames:
            return None
        first_prefill = max(state.context_chunks, 1)  # chunk 0 has nothing to prefill
        return StepPlan(
            loop=PREFILL, index=state.chunk - first_prefill, total=len(state.layouts) - first_prefill,
            call=far_prefill, inputs={"transformer": self.transformer, "text": state.text, "layout": layout,
                                      "context": state.latents[:, :, : layout.context_frames], "cache": state.cache},
        )

    def _step_plan(self, state: FarRolloutState) -> StepPlan | Done:
        if state.chunk >= len(state.layouts):
            return DONE
        layout = state.layouts[state.chunk]
        t = state.schedule.timesteps[state.step]
        r = state.sampler.target_timestep(state.schedule, state.step)
        latents = state.chunk_latents
        if state.cache is None:  # recompute: finished chunks, then the one being generated
            latents = torch.cat([state.latents[:, :, : layout.context_frames], latents], dim=2)
        total = (len(state.layouts) - state.context_chunks) * state.schedule.num_steps
        return StepPlan(
            loop=STEP, index=state.done_steps, total=total, call=far_step,
            inputs={"transformer": self.transformer, "latents": latents, "t": t.reshape(1), "r": r.reshape(1),
                    "text": state.text, "layout": layout, "cache": state.cache,
                    "guidance_scale": state.guidance_scale},
        )

    # -- results ----------------------------------------------------------------------

    def advance(self, state: FarRolloutState, result: Any) -> FarRolloutState:
        if state.pending == DECODE:
            self._emit(state, result)
        elif state.pending == PREFILL:
            state.prefilled = True
        else:
            state.chunk_latents = state.sampler.step(state.sampler_state, state.step, result, state.chunk_latents)
            state.step += 1
            state.done_steps += 1
            if state.step == state.schedule.num_steps:
                self._finish_chunk(state)
        return state

    def _emit(self, state: FarRolloutState, frames: Tensor) -> None:
        k = state.decoded
        start, _ = video_frame_range(state.frame_starts[k], state.frame_starts[k + 1], self.vae.config.temporal_factor)
        assert state.frames is not None
        state.frames.append(frames)
        state.decoded += 1
        state.ctx.emit(VideoChunk(index=k, total=len(state.layouts), start_frame=start, frames=frames.numpy()))

    def _finish_chunk(self, state: FarRolloutState) -> None:
        k = state.chunk
        start, stop = state.frame_starts[k], state.frame_starts[k + 1]
        state.latents[:, :, start:stop] = state.chunk_latents
        state.chunk, state.step, state.prefilled = k + 1, 0, False
        state.sampler_state = state.sampler.init_state(state.schedule)
        if state.chunk < len(state.layouts):
            state.chunk_latents = state.noise[:, :, stop : state.frame_starts[k + 2]]

    def finalize(self, state: FarRolloutState) -> dict[str, Any]:
        _release(state)
        if not torch.isfinite(state.latents).all():
            raise NonFiniteOutput.of("rollout", self.dtype)
        out: dict[str, Any] = {"latents": state.latents.float()}
        if state.frames is not None:
            out["video"] = np.ascontiguousarray(torch.cat(state.frames).numpy())
        return out


def _release(state: FarRolloutState) -> None:
    """Drop the request's KV slab (idempotent: finalize and the runtime's release path both call it)."""
    state.cache = None
