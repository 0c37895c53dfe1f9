"""AnyFlow-FAR chunk rollout: chunk by chunk, a few flow-map steps each, attending to earlier chunks.

Plans, in order, for every chunk k: a KV prefill of chunks [0, k) (none for chunk 0),
one plan per flow-map step, then (with a VAE) the decode of chunk k, whose frames go
to the caller at once through the loop context. Conditioning chunks (I2V / V2V) are
decoded first and never denoised. The KV slab comes from the runtime's cache manager
at `init` and is released when the loop ends however it ends. With `kv_cache=False`
every step recomputes the whole sequence instead (same results, no slab).

Sessions (extend_from): a finished rollout can leave its KV for a continuation. When the
deployment keeps sessions, a last plan prefills the whole video as the context of the chunk
that would come next (under the source's text, as the rollout would have) and a compact copy
goes to the cache manager under the request id. An extension's first chunk attends to that
KV: copied from the resident session, or rebuilt (same ops, same inputs, so the same values)
from the source's stored latents and prompts when it was evicted. From its second chunk on,
every prefill re-embeds the whole context under the new prompt, as FAR does at every chunk.

CFG parallel (`pair`, a --cfg-parallel rank pair): cfg-rank 0 runs the conditional branch and cfg-rank 1 the
unconditional one, each with its branch's text and a KV slab of its branch alone; every step's two predictions are
all-gathered and combined alike on both ranks, so both roll out the same chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, cast

import numpy as np
import torch
from torch import Tensor

from vidloom.core.denoiser import DenoiseInputs
from vidloom.core.errors import InvalidRequest, NonFiniteOutput
from vidloom.core.loop import DONE, NETWORK, Done, LoopContext, SessionContext, StepPlan
from vidloom.core.output import VideoChunk
from vidloom.core.request import GenerationRequest
from vidloom.core.session import VideoSession, latents_to_cpu
from vidloom.diffusion.flow_map_euler import FlowMapEulerSampler
from vidloom.diffusion.guidance import BranchExchange, GuidanceScale, cfg_combine
from vidloom.diffusion.sampler import SamplerConfig, Schedule, make_sampler
from vidloom.layers.tiling import SpatialTiling
from vidloom.models.wan.vae import WanVAE
from vidloom.families.wan_causal.kv_cache import FarKVCache
from vidloom.families.wan_causal.layout import ChunkLayout
from vidloom.families.wan_causal.text import FarText
from vidloom.families.wan_causal.transformer import FarTransformer
from vidloom.families.wan_causal.network import FarNetwork
from vidloom.families.wan_causal.decode import ChunkDecoder, decode_chunk, new_stream, video_frame_range

CHUNK_PHASE = "chunks"
"""Progress phase reported once per finished chunk (plan steps report under their loop names)."""
PREFILL, STEP, DECODE, SESSION = "kv_prefill", "rollout", "decode", "kv_session"
"""Plan kinds, also their progress phases (SESSION: a session's KV built at the end, or rebuilt to extend)."""

TextEncode = Callable[[str, str | None, bool], tuple[Tensor, Tensor | None]]
"""(prompt, negative prompt, uses CFG) -> (prompt_embeds, negative_embeds or None), as the program's text node."""


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


def extension_partition(source: tuple[int, ...], latent_frames: int, default: tuple[int, ...]) -> tuple[int, ...]:
    """An extension's chunks (FAR's rhythm, so the recipe's rule): the source's chunks, then the new latent
    frames in chunks of the checkpoint's largest size (the last one shorter)."""
    rest = latent_frames - sum(source)
    if rest <= 0:
        raise InvalidRequest("num_frames", f"{latent_frames} latent frames leave none after the source's {sum(source)}")
    size = max(default[1:], default=default[0])
    return (*source, *([size] * (rest // size)), *((rest % size,) if rest % size else ()))


def rollout_partition(request: GenerationRequest, latent_frames: int, default: tuple[int, ...]) -> tuple[int, ...]:
    """Chunks of `request`'s rollout: an extension keeps its source's chunks and appends new ones."""
    if isinstance(request.option("extend_from"), VideoSession):
        return extension_partition(request.option("extend_from").partition, latent_frames, default)
    return chunk_partition(latent_frames, default)


def branch_embeds(prompt_embeds: Tensor, negative_embeds: Tensor | None, pair: BranchExchange | None = None) -> Tensor:
    """CFG branches batched as the reference batches them: [uncond, cond]; a CFG-parallel rank's own branch alone
    (cfg-rank 0: cond, 1: uncond)."""
    if negative_embeds is None:
        return prompt_embeds
    if pair is not None:
        return prompt_embeds if pair.rank == 0 else negative_embeds
    return torch.cat([negative_embeds, prompt_embeds])


def rebuild_session_kv(
    transformer: FarTransformer, encode: TextEncode, session: VideoSession, layout: ChunkLayout, cache: FarKVCache,
    dtype: torch.dtype, pair: BranchExchange | None = None,
) -> None:
    """The KV a resident session would hold, from the source's latents and prompts, into `cache`."""
    embeds = branch_embeds(*encode(session.prompt, session.negative_prompt, session.uses_cfg), pair).to(dtype)
    context = session.latents[:, :, : layout.context_frames].to(cache.keys.device).to(dtype)
    far_prefill(transformer, context, transformer.embed_text(embeds), layout, cache)


FAR_STEP_INPUTS = DenoiseInputs(("latents", "t", "r", "text"), ("guidance_scale",))
"""A rollout step's inputs as cross-request batching stacks them (runtime.batching): each request's chunk latents,
(t, r) and text (FarText.stack), its own guidance scale; the network view stacks the requests' KV slabs."""


def far_step(network: FarNetwork, latents: Tensor, t: Tensor, r: Tensor, text: FarText,
             guidance_scale: GuidanceScale, pair: BranchExchange | None = None) -> Tensor:
    """One flow-map prediction for the generated chunk of each of the N requests in `latents` [N, ...] (one, unless
    batched), CFG branches batched as [uncond, cond] like the reference (branch-major over the requests, as
    FarText.stack stacks their texts); under CFG parallel (`pair`) this rank's branch, the pair's two predictions
    combined alike on both ranks. `guidance_scale`: a float, or one per request [N, 1, 1, 1, 1] (cfg_combine)."""
    branches = text.batch // latents.shape[0]
    x = latents[None].expand(branches, *latents.shape).flatten(0, 1)
    out = network(x, t[None].expand(branches, -1).flatten(), r[None].expand(branches, -1).flatten(), text)
    if pair is not None:
        cond, uncond = pair.all_gather(out).unbind(0)
    elif branches == 1:
        return out
    else:
        uncond, cond = out.chunk(2)
    return cfg_combine(cond, uncond, guidance_scale)


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
    stream: ChunkDecoder | None = None
    step: int = 0
    prefilled: bool = False
    done_steps: int = 0
    reported: int = 0  # chunks reported through ctx.progress so far
    decoded: int = 0  # chunks decoded and emitted so far
    frames: list[Tensor] | None = None  # decoded chunks, [F, H, W, 3] each
    pending: str = ""  # kind of the plan `next` returned last
    partition: tuple[int, ...] = ()
    session: VideoSession | None = None  # the video this rollout extends
    resumed: str = ""  # how an extension got its source's KV: "resident" | "rebuilt"
    session_prefilled: bool = False  # the end-of-rollout prefill for a session ran


class FarRolloutLoop:
    """Causal chunk rollout over a shared FarTransformer (and VAE); per-request state only in FarRolloutState."""

    name = STEP

    def __init__(self, transformer: FarTransformer, sampler_config: SamplerConfig, dtype: torch.dtype,
                 kv_cache: bool = True, vae: WanVAE | None = None, text_encode: TextEncode | None = None,
                 tiling: SpatialTiling | None = None, pair: BranchExchange | None = None) -> None:
        """`vae`: decode and emit each chunk as it finishes (and write "video"); None: latents only.
        `text_encode`: rebuilds an evicted session's KV (extensions need it). `tiling`: the deployment's
        vae_tile (each chunk decodes in spatial tiles, each tile's causal state carried across chunks).
        `pair`: a --cfg-parallel rank pair; this rank runs one CFG branch (requests are checked to use CFG)."""
        self.pair = pair
        self.tiling = tiling
        self.text_encode = text_encode
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
        partition = rollout_partition(request, noise.shape[2], config.chunk_partition)
        layouts = [ChunkLayout.for_chunk(partition, k, (noise.shape[3], noise.shape[4]), config)
                   for k in range(len(partition))]
        starts = [sum(partition[:k]) for k in range(len(partition) + 1)]
        latents, first = self._conditioned(noise, slots["context_latents"], starts)
        state = FarRolloutState(
            layouts=layouts, noise=noise, latents=latents, text=self.transformer.embed_text(self._branches(slots)),
            guidance_scale=float(request.guidance_scale), sampler=sampler, schedule=schedule, ctx=ctx,
            frame_starts=starts, context_chunks=first, chunk=first, reported=first,
            chunk_latents=noise[:, :, starts[first] : starts[first + 1]], sampler_state=sampler.init_state(schedule),
            partition=partition, session=request.option("extend_from"),
        )
        if self.vae is not None:
            state.stream, state.frames = new_stream(self.vae, self.tiling), []
        if self.kv_cache:
            ctx.hold(lambda: _release(state))
            batch = state.text.batch
            # A static slab under cuda_graphs (one an earlier request of this shape held: the step graphs recorded
            # over it replay), else a new one.
            state.cache = ctx.allocate(self._cache_bytes(layouts, batch),
                                       lambda: self.transformer.new_cache(layouts, batch, noise.device, self.dtype),
                                       reuse=self.transformer.cache_key(layouts, batch, noise.device, self.dtype),
                                       ).clear_context()
        if state.session is not None:
            self._resume(state)
        return state

    def _resume(self, state: FarRolloutState) -> None:
        """An extension: take the source's KV for the first new chunk from its resident session, if any."""
        if state.cache is None or self.text_encode is None:
            raise ValueError("extending a video needs the KV-cache rollout and a text encoder to rebuild sessions")
        assert state.session is not None
        session = getattr(state.ctx, "session", None)
        resident = session(state.session.session_id) if session is not None else None
        layout = state.layouts[state.chunk]
        if (isinstance(resident, FarKVCache) and resident.context_tokens == layout.context_tokens
                and resident.keys.shape[1] == state.cache.keys.shape[1]):
            state.cache.load_context(resident)
            state.prefilled, state.resumed = True, "resident"
        else:
            state.resumed = "rebuilt"  # the prefill plan rebuilds it first

    def _cache_bytes(self, layouts: list[ChunkLayout], batch: int) -> int:
        return self.transformer.cache_bytes(layouts, batch, self.dtype)

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
        if self.pair is not None and slots["negative_embeds"] is None:  # requests are checked at submit
            raise ValueError("CFG-parallel needs the unconditional branch: guidance_scale must be > 1")
        return branch_embeds(slots["prompt_embeds"], slots["negative_embeds"], self.pair).to(self.dtype)

    # -- plans ------------------------------------------------------------------------

    def next(self, state: FarRolloutState) -> StepPlan | Done:
        if state.reported < state.chunk:
            # Reported here rather than in advance, so it follows the runtime's event for the chunk's last step.
            state.reported = state.chunk
            state.ctx.progress(CHUNK_PHASE, state.chunk, len(state.layouts))
        plan = (self._decode_plan(state) or self._prefill_plan(state) or self._session_plan(state)
                or self._step_plan(state))
        state.pending = plan.loop if isinstance(plan, StepPlan) else ""
        return plan

    def _decode_plan(self, state: FarRolloutState) -> StepPlan | None:
        if state.stream is None or state.decoded >= state.chunk:
            return None
        k = state.decoded
        latents = state.latents[:, :, state.frame_starts[k] : state.frame_starts[k + 1]]
        return StepPlan(loop=DECODE, index=k, total=len(state.layouts), call=decode_chunk, runs_alone=True,
                        inputs={"vae": self.vae, "stream": state.stream, "latents": latents})

    def _prefill_plan(self, state: FarRolloutState) -> StepPlan | None:
        if state.chunk >= len(state.layouts) or state.cache is None or state.prefilled:
            return None
        layout = state.layouts[state.chunk]
        if not layout.context_frames:
            return None
        if state.resumed == "rebuilt" and state.chunk == state.context_chunks:
            assert state.session is not None
            return StepPlan(loop=SESSION, index=0, total=1, call=rebuild_session_kv, runs_alone=True,
                            inputs={"transformer": self.transformer, "encode": self.text_encode,
                                    "session": state.session, "layout": layout, "cache": state.cache,
                                    "dtype": self.dtype, "pair": self.pair})
        first_prefill = max(state.context_chunks, 1)  # chunk 0 has nothing to prefill
        return StepPlan(
            loop=PREFILL, index=state.chunk - first_prefill, total=len(state.layouts) - first_prefill,
            call=far_prefill, runs_alone=True,
            inputs={"transformer": self.transformer, "text": state.text, "layout": layout,
                    "context": state.latents[:, :, : layout.context_frames], "cache": state.cache},
        )

    def _session_plan(self, state: FarRolloutState) -> StepPlan | None:
        """Once every chunk is out: the whole video prefilled as the next chunk's context, for a session."""
        if (state.chunk < len(state.layouts) or state.cache is None or state.session_prefilled
                or not getattr(state.ctx, "keeps_sessions", False)):
            return None
        return StepPlan(loop=SESSION, index=0, total=1, call=far_prefill, runs_alone=True,
                        inputs={"transformer": self.transformer, "text": state.text, "layout": self._next_layout(state),
                                "context": state.latents, "cache": state.cache})

    def _next_layout(self, state: FarRolloutState) -> ChunkLayout:
        """The layout of a chunk after the last (its size does not change the context it attends to)."""
        partition = (*state.partition, state.partition[-1])
        hw = (state.noise.shape[3], state.noise.shape[4])
        return ChunkLayout.for_chunk(partition, len(state.partition), hw, self.transformer.config)

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
            loop=STEP, index=state.done_steps, total=total, call=far_step, denoiser=FAR_STEP_INPUTS,
            inputs={NETWORK: FarNetwork(self.transformer, layout, state.cache, state.chunk), "latents": latents,
                    "t": t.reshape(1), "r": r.reshape(1), "text": state.text, "guidance_scale": state.guidance_scale,
                    "pair": self.pair},
        )

    # -- results ----------------------------------------------------------------------

    def advance(self, state: FarRolloutState, result: Any) -> FarRolloutState:
        if state.pending == DECODE:
            self._emit(state, result)
        elif state.pending == SESSION:
            if state.chunk < len(state.layouts):
                state.prefilled = True  # rebuilt the source's KV: the first new chunk's context
            else:
                state.session_prefilled = True
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
        if not torch.isfinite(state.latents).all():
            _release(state)
            raise NonFiniteOutput.of("rollout", self.dtype)
        if state.session_prefilled and state.cache is not None:
            slab = state.cache
            # Only a SessionContext plans the session prefill (keeps_sessions), so only one gets here.
            cast(SessionContext, state.ctx).keep_session(FarKVCache.context_bytes(slab.keys, slab.context_rows),
                                                         slab.context_copy)
        _release(state)
        # What an extension of this video needs (results.video_output makes it a VideoSession).
        session = {"latents": latents_to_cpu(state.latents), "partition": state.partition, "resumed": state.resumed}
        out: dict[str, Any] = {"latents": state.latents.float(), "session": session}
        if state.frames is not None:
            out["video"] = np.ascontiguousarray(torch.cat(state.frames).numpy())
        return out


def _release(state: FarRolloutState) -> None:
    """Drop the request's KV slab (idempotent: finalize and the runtime's release path both call it)."""
    state.cache = None
