"""Helios' chunk loop (HeliosPipeline): autoregressive chunks, each a fresh bidirectional denoise over new noise
that also sees compressed history latents and a first-frame prefix; each chunk is decoded alone and streamed.

Every plan is one denoise step of the current chunk (the runtime runs each, so step caches, batching across
requests and cancellation apply per step). When a chunk's last step is folded in, the chunk is decoded and its
frames go to the caller at once: the decode is part of that step's unit rather than a plan of its own, so that
every plan stacks with other requests' (a plan that declares no denoiser inputs would run the request alone). No
KV cache: the history is re-embedded at every step, as the reference does, so nothing outlives the request.
A prompt set on the instance's LivePrompts while the request runs is encoded when the next chunk starts (after the
previous chunk went to the caller) and conditions the chunks from then on; chunks already started keep theirs.
The finished chunks' latents are the video's session: what an extension (extend_from) continues from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

from vidloom.core.denoiser import GUIDANCE_INPUTS
from vidloom.core.errors import NonFiniteOutput
from vidloom.core.live_prompt import LivePrompts
from vidloom.core.loop import DONE, NETWORK, Done, LoopContext, StepPlan
from vidloom.core.output import VideoChunk
from vidloom.core.session import latents_to_cpu
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import GuidancePolicy
from vidloom.diffusion.prompt_kv import PreparedPrompts
from vidloom.diffusion.sampler import Schedule
from vidloom.runtime.prompt_buckets import prompt_bucket
from vidloom.families.helios.conditioning import MediaConditioning
from vidloom.families.helios.network import HeliosNetwork
from vidloom.families.helios.schedule import HeliosSchedule
from vidloom.families.helios.transformer import HeliosHistory, HeliosTransformer
from vidloom.layers.tiling import SpatialTiling
from vidloom.models.wan.text import WanTextEncoder
from vidloom.models.wan.vae import WanVAE

# HeliosPipeline.__call__'s defaults: history of 16 + 2 + 1 latent frames (long, mid, short: the patch sizes
# 4x, 2x, 1x), 9 latent frames (33 video frames) per chunk, the first frame kept as the short history's prefix.
HISTORY_SIZES = (16, 2, 1)
CHUNK_LATENT_FRAMES = 9
CHUNK_PHASE = "chunks"
"""Progress phase reported once per finished chunk (step plans report under their loop name)."""
STEP = "denoise"


def chunk_frames(temporal_factor: int) -> int:
    """Video frames one chunk decodes to (33 for Wan's VAE)."""
    return (CHUNK_LATENT_FRAMES - 1) * temporal_factor + 1


def num_chunks(num_frames: int, temporal_factor: int) -> int:
    """Chunks the reference generates for `num_frames` (ceil; its output is then trimmed to 4k+1)."""
    window = chunk_frames(temporal_factor)
    return max(1, -(-num_frames // window))


def frame_indices() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Latent frame positions (chunk, short, mid, long): prefix at 0, then long, mid, 1x history, then the chunk;
    the same every chunk (the reference's relative RoPE layout)."""
    long, mid, short = HISTORY_SIZES
    indices = torch.arange(1 + long + mid + short + CHUNK_LATENT_FRAMES)
    prefix, i_long, i_mid, i_short, i_chunk = indices.split([1, long, mid, short, CHUNK_LATENT_FRAMES])
    return i_chunk, torch.cat([prefix, i_short]), i_mid, i_long


def decode_chunk(vae: WanVAE, latents: Tensor, tiling: SpatialTiling | None = None) -> Tensor:
    """One chunk's normalised latents [1, C, T, h, w], decoded alone -> frames [F, H, W, 3] in [0, 1] on the CPU.
    `tiling`: the deployment's vae_tile; the chunk then decodes in overlapping spatial tiles (WanVAE.decode's, the
    shared rule of vidloom.layers.tiling), so the decode's peak follows the tile, as the reference's chunk decode does
    after `vae.enable_tiling()`."""
    vae_dtype = next(vae.parameters()).dtype
    with torch.inference_mode():
        video = vae.decode(vae.denormalize_latents(latents.to(vae_dtype)), tiling=tiling)
    return (video[0].float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).cpu()


@dataclass
class HeliosChunkState:
    """One request's chunk rollout; owned by that request alone."""

    ctx: LoopContext
    request_id: str  # its entry in the live prompts
    num_frames: int  # frames the caller asked for (the output is the reference's first num_frames)
    total_chunks: int
    history: Tensor  # float32 [1, C, sum(HISTORY_SIZES), h, w]: the newest latent frames (zeros before any)
    generator: torch.Generator  # the request's noise stream: one draw per chunk, in chunk order
    schedule: Schedule
    sampler: Any
    prompt_embeds: Tensor
    negative_embeds: Tensor | None
    guidance_scale: float
    latents: Tensor  # float32 [1, C, 9, h, w]: the chunk being denoised
    sampler_state: Any
    stage_schedules: tuple[Schedule, ...] = ()  # the pyramid's, one per stage (the base loop: just `schedule`)
    first_schedules: tuple[Schedule, ...] = ()  # the first chunk's when they differ (Helios-Distilled's amplified)
    stage: int = 0  # the pyramid stage being denoised
    prefix: Tensor | None = None  # [1, C, 1, h, w] the first frame's latents (T2V: None before the first chunk)
    chunk: int = 0
    step: int = 0
    frames: list[Tensor] = field(default_factory=list)  # decoded chunks, [F, H, W, 3] each
    generated: list[Tensor] = field(default_factory=list)  # finished chunks' latents, float32 on the CPU
    unsent: Tensor | None = None  # the chunk decoded by the last advance, handed to the caller by the next `next`
    prompts: PreparedPrompts = field(default_factory=PreparedPrompts)  # each branch's prompt K/V, once per prompt

    def chunk_schedules(self, chunk: int) -> tuple[Schedule, ...]:
        """Chunk `chunk`'s schedules, one per stage."""
        return self.first_schedules if chunk == 0 and self.first_schedules else self.stage_schedules

    @property
    def current_schedules(self) -> tuple[Schedule, ...]:
        return self.chunk_schedules(self.chunk)


class HeliosChunkLoop:
    """The base pipeline's chunk rollout over a shared HeliosTransformer and Wan VAE."""

    name = STEP

    def __init__(self, transformer: HeliosTransformer, vae: WanVAE, schedule: HeliosSchedule, dtype: torch.dtype,
                 guidance: GuidancePolicy, device: torch.device, text: WanTextEncoder,
                 live_prompts: LivePrompts, tiling: SpatialTiling | None = None) -> None:
        """`tiling`: the deployment's vae_tile, with which every chunk decodes (None: whole frames)."""
        self.transformer, self.vae, self.schedule = transformer, vae, schedule
        self.tiling = tiling
        self.text, self.live_prompts = text, live_prompts
        self.dtype, self.guidance, self.device = dtype, guidance, device
        # On the device, with the latents: the history's RoPE rows are computed from them inside the step (a CPU
        # table would not join the chunk's on a GPU, and a captured step may copy nothing from the host).
        self.indices = tuple(index.to(device) for index in frame_indices())

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> HeliosChunkState:
        request: GenerationRequest = slots["request"]
        vae = self.vae.config
        h, w = request.height // vae.spatial_factor, request.width // vae.spatial_factor
        schedules = self._schedules(request.num_inference_steps, h, w)
        sampler = self._sampler(request)
        generator: torch.Generator = slots["generator"]  # already drawn from for an image's conditioning
        history = torch.zeros(1, vae.z_dim, sum(HISTORY_SIZES), h, w, device=self.device)
        media: MediaConditioning | None = slots["conditioning"]
        if media is not None:  # the newest history frames are the image's still or the clip's last chunks
            kept = media.history[:, :, -history.shape[2]:]
            history[:, :, history.shape[2] - kept.shape[2]:] = kept
        negative = slots["negative_embeds"]
        self.live_prompts.open(request.request_id)
        ctx.hold(lambda: self.live_prompts.close(request.request_id))
        state = HeliosChunkState(
            ctx=ctx, request_id=request.request_id, num_frames=request.num_frames, total_chunks=num_chunks(request.num_frames, vae.temporal_factor),
            history=history, generator=generator, schedule=schedules[0], sampler=sampler,
            prompt_embeds=slots["prompt_embeds"].to(self.dtype),
            negative_embeds=None if negative is None else negative.to(self.dtype),
            guidance_scale=float(request.guidance_scale), latents=history[:, :, :0], sampler_state=None,
            prefix=None if media is None else media.prefix, stage_schedules=schedules,
            first_schedules=self._first_chunk_schedules(request, h, w),
            prompts=PreparedPrompts(bucket=prompt_bucket(ctx)),
        )
        self._start_chunk(state)
        return state

    def _tokens(self, h: int, w: int) -> int:
        """Transformer tokens of a chunk on an h x w latent grid."""
        patch = self.transformer.config.patch_size
        return CHUNK_LATENT_FRAMES * h * w // (patch[0] * patch[1] * patch[2])

    def _schedules(self, num_steps: int, h: int, w: int) -> tuple[Schedule, ...]:
        """Every chunk's schedules, one per stage (the base pipeline: one)."""
        return (self.schedule.schedule(num_steps, self._tokens(h, w)),)

    def _first_chunk_schedules(self, request: GenerationRequest, h: int, w: int) -> tuple[Schedule, ...]:
        """The first chunk's schedules when they are not every chunk's (empty: they are)."""
        return ()

    def _sampler(self, request: GenerationRequest) -> Any:
        return self.schedule.sampler(request.sampler)

    def _start_chunk(self, state: HeliosChunkState) -> None:
        """The next chunk's fresh noise and solver state."""
        state.latents = self._noise(state.generator, state.history)
        state.sampler_state = state.sampler.init_state(state.schedule)

    def _noise(self, generator: torch.Generator, history: Tensor) -> Tensor:
        """A chunk's fresh noise [1, C, 9, h, w], float32, drawn on the CPU as the reference draws it."""
        _, channels, _, h, w = history.shape
        noise = torch.randn((1, channels, CHUNK_LATENT_FRAMES, h, w), generator=generator, dtype=torch.float32)
        return noise.to(self.device)

    # -- plans ------------------------------------------------------------------------

    def next(self, state: HeliosChunkState) -> StepPlan | Done:
        if state.unsent is not None:
            # Sent here rather than in advance, so the chunk follows the runtime's event for its last step.
            self._emit(state, state.unsent)
            state.unsent = None
        if state.chunk >= state.total_chunks:
            return DONE
        if state.step == 0 and state.chunk > 0:  # a chunk boundary: a prompt set by now conditions this chunk on
            prompt = self.live_prompts.take(state.request_id)
            if prompt is not None:  # the negative prompt's embeddings stay
                state.prompt_embeds = self.text.encode([prompt]).to(self.dtype)
        steps = [sum(s.num_steps for s in state.chunk_schedules(k)) for k in range(state.total_chunks)]
        done = sum(s.num_steps for s in state.current_schedules[:state.stage]) + state.step
        return StepPlan(
            loop=STEP, index=sum(steps[:state.chunk]) + done, total=sum(steps),
            call=self.guidance, denoiser=GUIDANCE_INPUTS,
            inputs={NETWORK: self._network(state), "latents": state.latents.to(self.dtype), "timestep": self._timestep(state),
                    "prompt_embeds": state.prompts.get(self.transformer, state.prompt_embeds),
                    "negative_embeds": state.prompts.get(self.transformer, state.negative_embeds),
                    "guidance_scale": state.guidance_scale},
        )

    def _timestep(self, state: HeliosChunkState) -> Tensor:
        return state.schedule.timesteps[state.step].reshape(1).to(self.device)

    def _network(self, state: HeliosChunkState) -> HeliosNetwork:
        """The chunk's view: history split into long, mid and 1x terms; the short term gets the prefix first."""
        long, mid, short = state.history.to(self.dtype).split(list(HISTORY_SIZES), dim=2)
        prefix = state.prefix if state.prefix is not None else torch.zeros_like(short[:, :, :1])
        i_chunk, i_short, i_mid, i_long = self.indices
        history = HeliosHistory(torch.cat([prefix.to(self.dtype), short], dim=2), i_short, mid, i_mid, long, i_long)
        scope = state.chunk * len(state.current_schedules) + state.stage  # a step cache restarts per chunk and stage
        return HeliosNetwork(self.transformer, i_chunk, history, cache_scope=scope)

    # -- results ----------------------------------------------------------------------

    def advance(self, state: HeliosChunkState, result: Any) -> HeliosChunkState:
        state.latents = state.sampler.step(state.sampler_state, state.step, result, state.latents)
        state.step += 1
        if state.step == state.schedule.num_steps:
            self._finish_chunk(state)
        return state

    def _finish_chunk(self, state: HeliosChunkState) -> None:
        latents = state.latents
        if not torch.isfinite(latents).all():
            raise NonFiniteOutput.of("denoising", self.dtype)
        if state.prefix is None:
            state.prefix = latents[:, :, :1]  # text to video: the first frame becomes every later chunk's prefix
        state.history = torch.cat([state.history, latents], dim=2)[:, :, -sum(HISTORY_SIZES):]
        state.generated.append(latents_to_cpu(latents))
        state.unsent = decode_chunk(self.vae, latents, self.tiling)
        state.chunk, state.step = state.chunk + 1, 0
        if state.chunk < state.total_chunks:
            self._start_chunk(state)

    def _emit(self, state: HeliosChunkState, frames: Tensor) -> None:
        k = len(state.frames)
        start = sum(f.shape[0] for f in state.frames)
        frames = frames[: max(0, state.num_frames - start)]  # the last chunk is cut to the asked length
        state.frames.append(frames)
        state.ctx.emit(VideoChunk(index=k, total=state.total_chunks, start_frame=start, frames=frames.numpy()))
        state.ctx.progress(CHUNK_PHASE, k + 1, state.total_chunks)

    def finalize(self, state: HeliosChunkState) -> dict[str, Any]:
        # What an extension of this video needs (results.video_output makes it a VideoSession).
        session = {"latents": torch.cat(state.generated, dim=2),
                   "partition": (CHUNK_LATENT_FRAMES,) * len(state.generated), "resumed": None}
        return {"video": np.ascontiguousarray(torch.cat(state.frames).numpy()), "session": session}
