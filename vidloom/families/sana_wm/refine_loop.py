"""SANA-WM stage 2: the LTX-2 refiner's chunk-causal rollout over the stage-1 latents.

Plans, in order: one forward that captures the sink (the first `sink_size` stage-1 frames, clean, at
sigma 0); then for each chunk of `block_size` latent frames, one plan per refiner sigma (a few-step
Euler from sigma_max, the chunk's stage-1 latents noised once), one forward of the refined chunk
at sigma 0 whose K/V join the sliding history (the newest `kv_max_frames - sink_size` frames), and
(with a causal-decoder VAE) the decode of the refined prefix, whose new frames go to the caller. The
sink's rotary positions slide so it sits right before the history. The window is a slab from the
runtime's cache manager (allocated at init, released with the loop however it ends). The per-chunk
noise and Euler update follow diffusers' `SanaWMLTX2Refiner.__call__` step by step (same draws, same
float32 rounding); the plan structure is ours. The sink frames are carried through unrefined.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.errors import NonFiniteOutput
from vidloom.core.loop import DONE, Done, LoopContext, StepPlan
from vidloom.core.output import VideoChunk
from vidloom.core.request import GenerationRequest
from vidloom.layers.tiling import SpatialTiling
from vidloom.models.ltx2.patches import pack_video, unpack_video
from vidloom.models.ltx2.transformer import LTX2Transformer
from vidloom.families.sana_wm.refiner import RefinerWindow, WindowMode, frame_rope, refiner_velocity
from vidloom.families.sana_wm.refiner_parallel import WHOLE_CHUNK, ChunkLayout
from vidloom.models.ltx2.text import LTX2Text

# SanaWMLTX2Refiner.__call__ defaults (the public release's distilled 3-step refiner and its window).
DISTILLED_SIGMAS = (0.909375, 0.725, 0.421875, 0.0)
SINK_SIZE, BLOCK_SIZE, KV_MAX_FRAMES = 1, 3, 11
SINK, STEP, CAPTURE, DECODE = "refine_sink", "refine", "refine_kv", "refine_decode"
"""Plan kinds (also their loop names in progress events)."""
CHUNK_PHASE = "refine_chunks"
"""Progress phase reported once per refined chunk."""


@dataclass(frozen=True)
class RefinerSettings:
    """The rollout's shape (SanaWMLTX2Refiner's keyword arguments and their defaults)."""

    sigmas: tuple[float, ...] = DISTILLED_SIGMAS  # descending, ending at 0
    sink_size: int = SINK_SIZE
    block_size: int = BLOCK_SIZE
    kv_max_frames: int = KV_MAX_FRAMES


def refine_forward(dit: LTX2Transformer, tokens: Tensor, text: Tensor, mask: Tensor, timestep: Tensor,
                   rope: Any, window: RefinerWindow, mode: WindowMode, shards: ChunkLayout = WHOLE_CHUNK) -> Tensor:
    """One plan's body: the refiner DiT over the window (every rank of an sp group gets the whole chunk and keeps
    its part of it: `shards`)."""
    return refiner_velocity(dit, tokens, text, mask, timestep, rope, window, mode, shards)


@dataclass
class RefineState:
    source: Tensor  # the stage-1 latents [B, C, F, h, w], float32 (the clean target of each chunk)
    out: Tensor  # refined latents, filled chunk by chunk
    text: LTX2Text
    window: RefinerWindow
    generator: torch.Generator
    fps: float
    ctx: LoopContext
    chunk: int = 0
    step: int = -1  # -1: the sink capture is next; 0..S-1: a denoise step; S: the history capture
    block: Tensor | None = None  # the chunk being refined, in the compute dtype
    emitted: list[Tensor] = field(default_factory=list)  # streamed frames [F, H, W, 3] in [0, 1], in order
    sigmas: Tensor = field(default_factory=lambda: torch.tensor(DISTILLED_SIGMAS, dtype=torch.float32))


class SanaWMRefineLoop:
    """Reads `request`, `latents` (stage 1), `refiner_text`; writes `latents` (refined)."""

    name = STEP

    def __init__(self, transformer: LTX2Transformer, dtype: torch.dtype,
                 settings: RefinerSettings = RefinerSettings(), vae: Any = None,
                 tiling: SpatialTiling | None = None, shards: ChunkLayout = WHOLE_CHUNK) -> None:
        """`vae` (a causal-decoder LTX-2 VAE): decode and emit each refined chunk as it finishes, and write
        "video" (the chunks in order); None: latents only (the program decodes once at the end). `tiling`:
        the deployment's vae_tile, spatial only, so a tiled prefix still decodes to the tiled video's first frames.
        `shards`: under sequence parallel, this rank's part of each chunk and of the heads (refiner_parallel.py);
        its window then holds heads/K of every window token."""
        self.transformer, self.dtype, self.settings, self.vae = transformer, dtype, settings, vae
        self.tiling, self.shards = tiling, shards
        self.steps = len(settings.sigmas) - 1

    def num_chunks(self, frames: int) -> int:
        s = self.settings
        return (frames - s.sink_size + s.block_size - 1) // s.block_size

    def window_bytes(self, batch: int, frames: int, height: int, width: int) -> int:
        return RefinerWindow.nbytes_for(*self._window_shape(batch, frames, height, width), self.dtype)

    def _window_shape(self, batch: int, frames: int, height: int, width: int) -> tuple[int, int, int, int, int]:
        c, s = self.transformer.config, self.settings
        per_frame = (height // c.patch_size) * (width // c.patch_size) // c.patch_size_t
        history = s.kv_max_frames - s.sink_size
        capacity = history if history > 0 else frames - s.sink_size  # <= 0: the reference never trims
        inner = c.dim // self.shards.size  # this rank's heads of every window token
        return c.num_layers, batch, inner, s.sink_size * per_frame, min(capacity, frames) * per_frame

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> RefineState:
        request: GenerationRequest = slots["request"]
        source = slots["latents"].to(torch.float32)
        b, _, f, h, w = source.shape
        shape = self._window_shape(b, f, h, w)
        c = self.transformer.config
        per_frame = (h // c.patch_size) * (w // c.patch_size) // c.patch_size_t
        window = ctx.allocate(RefinerWindow.nbytes_for(*shape, self.dtype),
                              lambda: RefinerWindow(*shape, per_frame, source.device, self.dtype))
        text: LTX2Text = slots["refiner_text"]
        # The reference's refiner draws each chunk's noise from the generator it is given; we seed it with
        # the request's seed (a CPU generator, as stage 1's noise).
        generator = torch.Generator("cpu").manual_seed(int(request.seed))
        return RefineState(source=source, out=source.clone(), text=text.to(self.dtype), window=window,
                           generator=generator, fps=float(request.fps), ctx=ctx,
                           sigmas=torch.tensor(self.settings.sigmas, dtype=torch.float32))

    def _frames(self, state: RefineState) -> tuple[int, int]:
        start = self.settings.sink_size + state.chunk * self.settings.block_size
        return start, min(start + self.settings.block_size, state.source.shape[2])

    def next(self, state: RefineState) -> StepPlan | Done:
        total = self.num_chunks(state.source.shape[2])
        if state.step < 0:
            return self._plan(state, SINK, 0, 1, state.source[:, :, : self.settings.sink_size], 0, 0.0,
                              WindowMode.CAPTURE_SINK)
        if state.chunk >= total:
            return DONE
        start, _ = self._frames(state)
        if state.block is None:
            self._begin_chunk(state)
        if state.step < self.steps:
            sigma = float(state.sigmas[state.step].item())
            return self._plan(state, STEP, state.chunk * self.steps + state.step, total * self.steps, state.block,
                              start, sigma, WindowMode.ATTEND)
        if state.step == self.steps:
            return self._plan(state, CAPTURE, state.chunk, total, state.block, start, 0.0,
                              WindowMode.CAPTURE_HISTORY)
        _, end = self._frames(state)
        return StepPlan(loop=DECODE, index=state.chunk, total=total, call=decode_prefix,
                        inputs={"vae": self.vae, "latents": state.out[:, :, :end], "tiling": self.tiling})

    def _begin_chunk(self, state: RefineState) -> None:
        """The chunk's stage-1 latents noised to sigma_max (one draw per chunk) and the sink's slid rotary."""
        start, end = self._frames(state)
        s = self.settings
        clean = state.source[:, :, start:end]
        offset = start - state.window.history_frames - s.sink_size
        b, _, _, h, w = clean.shape
        state.window.sink_rope = frame_rope(self.transformer, b, offset, s.sink_size, h, w, state.fps, clean.device)
        noise = torch.randn(clean.shape, generator=state.generator, dtype=self.dtype).to(clean.device)
        sigma_max = float(state.sigmas[0])
        state.block = ((1.0 - sigma_max) * clean.float() + sigma_max * noise.float()).to(self.dtype)

    def _plan(self, state: RefineState, kind: str, index: int, total: int, block: Tensor, first_frame: int,
              sigma: float, mode: WindowMode) -> StepPlan:
        c = self.transformer.config
        b, _, f, h, w = block.shape
        rope = frame_rope(self.transformer, b, first_frame, f, h, w, state.fps, block.device)
        timestep = torch.full((b,), sigma * float(c.timestep_scale_multiplier), dtype=torch.float32,
                              device=block.device)
        return StepPlan(loop=kind, index=index, total=total, call=refine_forward, inputs={
            "dit": self.transformer, "tokens": pack_video(block.to(self.dtype), c.patch_size, c.patch_size_t),
            "text": state.text.video, "mask": state.text.mask, "timestep": timestep, "rope": rope,
            "window": state.window, "mode": mode, "shards": self.shards})

    def advance(self, state: RefineState, result: Tensor) -> RefineState:
        if state.step < 0:
            state.window.store_sink()
            state.step = 0
        elif state.step < self.steps:
            state.block = self._euler(state, result)
            state.step += 1
        elif state.step == self.steps:
            state.window.append_history()
            start, end = self._frames(state)
            state.out[:, :, start:end] = state.block.float()
            state.step += 1
            if self.vae is None:
                self._finish_chunk(state)
        else:
            self._emit(state, result)
            self._finish_chunk(state)
        return state

    def _finish_chunk(self, state: RefineState) -> None:
        state.chunk, state.step, state.block = state.chunk + 1, 0, None
        state.ctx.progress(CHUNK_PHASE, state.chunk, self.num_chunks(state.source.shape[2]))

    def _emit(self, state: RefineState, frames: Tensor) -> None:
        """The prefix decode's new frames go out; the first `sink_size` pixel frames never do (the
        reference drops them after its decode)."""
        done = sum(int(f.shape[0]) for f in state.emitted)
        new = frames[self.settings.sink_size + done:]
        state.emitted.append(new)
        state.ctx.emit(VideoChunk(index=state.chunk, total=self.num_chunks(state.source.shape[2]), start_frame=done,
                                  frames=new.numpy()))

    def _euler(self, state: RefineState, velocity: Tensor) -> Tensor:
        """x0 = x - sigma * v, the velocity back from x0, then the scheduler's Euler step (float32)."""
        c, block = self.transformer.config, state.block
        i = state.step
        sigma_t, next_t = state.sigmas[i], state.sigmas[i + 1]
        sigma = float(sigma_t.item())
        tokens = pack_video(block, c.patch_size, c.patch_size_t)
        _, _, frames, height, width = block.shape
        x0 = unpack_video((tokens.float() - velocity.float() * sigma_t.to(block.device)).to(self.dtype),
                          frames // c.patch_size_t, height // c.patch_size, width // c.patch_size, c.patch_size,
                          c.patch_size_t)
        if sigma <= 1.0e-6:
            return x0.to(self.dtype)
        v = (block.float() - x0.float()) / sigma
        return (block.float() + (next_t - sigma_t).to(block.device) * v).to(self.dtype)

    def finalize(self, state: RefineState) -> dict[str, Any]:
        if not torch.isfinite(state.out).all():
            raise NonFiniteOutput.of("refining", self.dtype)
        if self.vae is None:
            return {"latents": state.out}
        return {"latents": state.out, "video": torch.cat(state.emitted).numpy()}


def decode_prefix(vae: Any, latents: Tensor, tiling: SpatialTiling | None = None) -> Tensor:
    """Refined latents [1, C, F, h, w] so far -> their frames [1 + (F - 1) * t, H, W, 3] in [0, 1] on the CPU.
    With a causal decoder a prefix decodes to the first frames of the whole video's decode."""
    video = vae.decode(vae.denormalize_latents(latents.to(torch.float32)), tiling=tiling)
    return (video[0].float() / 2 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).cpu()
