"""LTX-2's denoise loop: flow-match Euler over joint video + audio tokens; the step body is a guidance policy.

The same loop class runs both passes of the two-stage program (stage 1 from noise, stage 2 over the
upsampled, re-noised latents) over the one resident transformer; they differ in name, schedule and scales.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Hashable, Mapping

import torch
from torch import Tensor

from vidloom.core.denoiser import DenoiseInputs
from vidloom.core.errors import NonFiniteOutput
from vidloom.core.loop import DONE, NETWORK, Done, LoopContext, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.av_guidance import AudioVideoGuidance, AudioVideoScales
from vidloom.diffusion.prompt_kv import PreparedPrompts
from vidloom.lora.apply import current_loras, lora_scope, with_adapter
from vidloom.lora.files import LoRALayer
from vidloom.models.ltx2.transformer import LTX2Conditioning, LTX2Positions, LTX2PreparedText, LTX2Ropes, \
    LTX2Transformer
from vidloom.models.ltx2.text import LTX2Text


@dataclass(frozen=True)
class StageLoRA:
    """An adapter one pass of the program always runs with (the deployment's stage-2 LoRA), at `scale`."""

    layers: Mapping[str, LoRALayer]  # LoRALinear key -> layer, as vidloom.lora.registry.read_adapter places them
    scale: float = 1.0


STAGE2_LORA = "stage2_lora"
"""The instance component holding the deployment's StageLoRA for stage 2 (absent: none)."""


@dataclass(frozen=True)
class LTX2Layout:
    """One request's token grid at the current stage."""

    frames: int  # latent frames
    height: int  # latent height
    width: int  # latent width
    audio_frames: int  # audio latent frames
    positions: LTX2Positions  # batch 1
    fps: float  # the video's frame rate: video positions are in seconds
    frozen: Tensor | None = None  # I2V: [1, N] 1 on the conditioning first frame's tokens (kept clean)

    @property
    def position_key(self) -> tuple[int, int, int, int, float]:
        """What `positions` are a function of (with the transformer's config): equal keys, equal positions."""
        return (self.frames, self.height, self.width, self.audio_frames, self.fps)


class LTX2Network:
    """The network a guidance policy calls for one request: (video, audio, text, timesteps) -> velocities.

    Built per request, so positions never live on the shared transformer. The rotary tables, which do not change
    between the request's steps, are computed once per batch size and kept here (`reuse`); on checkpoints whose text
    modulation is static, every block's text keys and values are prepared once per request and CFG branch by the
    loop (`prepare_prompt`, diffusion.prompt_kv) and come in where the text would.
    """

    def __init__(self, transformer: LTX2Transformer, positions: LTX2Positions, dtype: torch.dtype,
                 use_cross_timestep: bool, stage_lora: StageLoRA | None = None,
                 position_key: Hashable = None, reuse: bool = True) -> None:
        self.transformer, self.positions, self.dtype = transformer, positions, dtype
        self.use_cross_timestep = use_cross_timestep
        self.stage_lora = stage_lora
        self.position_key = position_key
        # A captured graph (graph_rebuild) replays its kernels on new static inputs: nothing may be reused there.
        self.reuse = reuse
        self._ropes: dict[int, LTX2Ropes] = {}

    def batch_key(self) -> Hashable:
        """Views with equal keys stack (runtime.batching): same transformer, pass and token positions (the
        layout's position_key: sizes, frames and fps set the video and audio coordinates). None (no key given):
        this request's steps run alone."""
        if self.position_key is None:
            return None
        return (id(self.transformer), self.dtype, self.use_cross_timestep, id(self.stage_lora), self.position_key)

    def graph_split(self) -> tuple[Hashable, tuple[LTX2Positions]]:
        """core.denoiser.GraphInputs: a captured step bakes in the transformer, dtype, pass and stage adapter; it
        reads this request's video and audio positions."""
        return (id(self.transformer), self.dtype, self.use_cross_timestep, id(self.stage_lora)), (self.positions,)

    def graph_rebuild(self, parts: tuple[LTX2Positions]) -> LTX2Network:
        return LTX2Network(self.transformer, parts[0], self.dtype, self.use_cross_timestep, self.stage_lora,
                           self.position_key, reuse=False)

    @staticmethod
    def stack(views: list[LTX2Network]) -> LTX2Network:
        """One network for requests stacked along the batch: equal keys mean equal positions, which embed
        repeats to the stacked batch."""
        return views[0]

    def prepare_prompt(self, text: LTX2Text) -> LTX2PreparedText | None:
        """core.denoiser.PreparesPrompt: every block's text keys/values of `text` and its mask, as this pass's
        forward (its stage adapter included) would project them; None where the checkpoint modulates its text by
        the timestep (LTX-2.3's prompt AdaLN): the steps then project it."""
        if not self.transformer.static_text:
            return None
        typed = text.to(self.dtype)
        with self._stage_scope():
            return self.transformer.prepare_text(typed.video, typed.audio, typed.mask, self.dtype)

    def __call__(
        self, video: Tensor, audio: Tensor, text: LTX2Text | LTX2PreparedText, timestep: Tensor,
        audio_timestep: Tensor, *,
        isolate: bool = False, skip: frozenset[int] = frozenset(),
    ) -> tuple[Tensor, Tensor]:
        stream, cond = self.embed(video, audio, text, timestep, audio_timestep, isolate=isolate, skip=skip)
        return self.head(self.run_blocks(stream, cond), cond)

    # The staged denoiser contract (core.denoiser.StagedDenoiser): __call__ is their composition, the
    # residual stream the (video, audio) token pair. Guidance passes (isolate, skip) travel in `cond`.

    @property
    def num_blocks(self) -> int:
        return self.transformer.num_blocks

    def embed(
        self, video: Tensor, audio: Tensor, text: LTX2Text | LTX2PreparedText, timestep: Tensor,
        audio_timestep: Tensor, *, isolate: bool = False, skip: frozenset[int] = frozenset(),
    ) -> tuple[tuple[Tensor, Tensor], LTX2Conditioning]:
        batch = video.shape[0]
        pos = LTX2Positions(self.positions.video.repeat(batch, 1, 1, 1), self.positions.audio.repeat(batch, 1, 1, 1))
        if isinstance(text, LTX2PreparedText):  # the loop's prepare_prompt: the blocks read it, not the text
            prepared, texts = text, (None, None, None)
        else:
            typed = text.to(self.dtype)
            prepared, texts = None, (typed.video, typed.audio, typed.mask)
        # Both pipelines condition LTX-2.3's text and cross-modal modulation on the scalar step timestep.
        with self._stage_scope():
            return self.transformer.embed(
                video.to(self.dtype), audio.to(self.dtype), *texts, timestep, audio_timestep, audio_timestep, pos,
                use_cross_timestep=self.use_cross_timestep, isolate_modalities=isolate, skip_self_attention=skip,
                ropes=self._rope_tables(pos), text=prepared,
            )

    def _rope_tables(self, positions: LTX2Positions) -> LTX2Ropes | None:
        """The tables of this request's positions at this batch size (None: the transformer builds them)."""
        if not self.reuse:
            return None
        batch = positions.video.shape[0]
        if batch not in self._ropes:
            self._ropes[batch] = self.transformer.rope_tables(positions)
        return self._ropes[batch]

    def run_blocks(self, x: tuple[Tensor, Tensor], cond: LTX2Conditioning, start: int = 0,
                   end: int | None = None) -> tuple[Tensor, Tensor]:
        with self._stage_scope():
            return self.transformer.run_blocks(x, cond, start, end)

    def block_input(self, x: tuple[Tensor, Tensor], cond: LTX2Conditioning, index: int = 0) -> Tensor:
        with self._stage_scope():
            return self.transformer.block_input(x, cond, index)

    def head(self, x: tuple[Tensor, Tensor], cond: LTX2Conditioning) -> tuple[Tensor, Tensor]:
        with self._stage_scope():
            return self.transformer.head(x, cond)

    def _stage_scope(self) -> contextlib.AbstractContextManager[Any]:
        """The stage's own adapter (the distilled stage-2 LoRA) on top of the request's, for this pass only: every
        stage of the forward runs inside it (adapted linears sit in the embedding, the blocks and the head)."""
        if self.stage_lora is None:
            return contextlib.nullcontext()
        return lora_scope(with_adapter(current_loras(), self.stage_lora.layers, self.stage_lora.scale))


@dataclass
class LTX2DenoiseState:
    """One request's pass; owned by that request alone."""

    video: Tensor  # float32 [1, N, C] packed video latents
    audio: Tensor  # float32 [1, Na, Ca] packed audio latents
    sigmas: Tensor  # float32 [steps + 1]
    network: LTX2Network
    prompt: LTX2Text
    negative: LTX2Text | None  # None when no stream uses CFG
    scales: AudioVideoScales
    frozen: Tensor | None  # [1, N] I2V conditioning tokens
    index: int = 0
    prompts: PreparedPrompts = field(default_factory=PreparedPrompts)  # each branch's text K/V, once per request


LTX2_DENOISE_INPUTS = DenoiseInputs(("video", "audio", "timestep", "audio_timestep", "sigma", "prompt", "negative"))
"""Cross-request batching of an LTX-2 step (runtime.batching): latents, timesteps, sigma and both prompts stack per
sample; `scales` (every stream's guidance) is shared, so only requests guided alike share a forward."""

SigmaFn = Callable[[GenerationRequest, int], Tensor]
"""(request, video tokens) -> float32 sigmas ending at 0."""
ScalesFn = Callable[[GenerationRequest], AudioVideoScales]


class LTX2DenoiseLoop:
    """Reads the `video_latents`, `audio_latents`, `layout` and text slots; writes the latents back."""

    def __init__(
        self, name: str, transformer: LTX2Transformer, dtype: torch.dtype, sigmas: SigmaFn, scales: ScalesFn,
        use_cross_timestep: bool, num_train_timesteps: int = 1000, guidance: AudioVideoGuidance | None = None,
        stage_lora: StageLoRA | None = None,
    ) -> None:
        self.name = name
        self.stage_lora = stage_lora
        self.transformer, self.dtype = transformer, dtype
        self.sigma_fn, self.scales_fn = sigmas, scales
        self.use_cross_timestep = use_cross_timestep
        self.num_train_timesteps = num_train_timesteps
        self.guidance = guidance or AudioVideoGuidance()

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> LTX2DenoiseState:
        request: GenerationRequest = slots["request"]
        layout: LTX2Layout = slots["layout"]
        video: Tensor = slots["video_latents"]
        scales = self.scales_fn(request)
        if scales.stg and not self.transformer.perturbed_blocks(scales.stg_blocks):
            # No named block's self-attention is perturbed on this checkpoint (LTX-2.0 is not built with
            # perturbed_attn; an index past the last block perturbs nothing): the STG pass would repeat the
            # conditional one and its term is zero, so it is not run (diffusers runs it and adds that zero).
            scales = replace(scales, video_stg=0.0, audio_stg=0.0)
        negative = slots["negative_text"] if scales.cfg else None
        if scales.cfg and negative is None:
            raise AssertionError("the program encodes a negative prompt whenever a pass uses CFG")
        return LTX2DenoiseState(
            video=video, audio=slots["audio_latents"], sigmas=self.sigma_fn(request, video.shape[1]),
            network=LTX2Network(self.transformer, layout.positions, self.dtype, self.use_cross_timestep,
                                self.stage_lora, layout.position_key),
            prompt=slots["prompt_text"], negative=negative, scales=scales, frozen=layout.frozen,
        )

    def next(self, state: LTX2DenoiseState) -> StepPlan | Done:
        total = len(state.sigmas) - 1
        if state.index >= total:
            return DONE
        sigma = state.sigmas[state.index]
        # The reference's timesteps are sigmas * num_train_timesteps (float32), not rounded.
        t = (state.sigmas[:-1] * self.num_train_timesteps)[state.index].to(state.video.device).reshape(1)
        video_t = t if state.frozen is None else t.unsqueeze(-1) * (1 - state.frozen)  # I2V: frame 0 at t = 0
        # sigma is per sample ([1, 1, 1], broadcast over tokens and channels) so requests at different steps batch;
        # the guidance's arithmetic is the same as with a 0-dim sigma.
        return StepPlan(
            loop=self.name, index=state.index, total=total, call=self.guidance, denoiser=LTX2_DENOISE_INPUTS,
            inputs={
                NETWORK: state.network, "video": state.video, "audio": state.audio, "timestep": video_t,
                "audio_timestep": t, "sigma": sigma.to(state.video.device).reshape(1, 1, 1),
                "prompt": state.prompts.get(state.network, state.prompt),
                "negative": state.prompts.get(state.network, state.negative), "scales": state.scales,
            },
        )

    def advance(self, state: LTX2DenoiseState, result: tuple[Tensor, Tensor]) -> LTX2DenoiseState:
        video_v, audio_v = result
        dt = (state.sigmas[state.index + 1] - state.sigmas[state.index]).to(state.video.device)
        stepped = state.video + dt * video_v
        if state.frozen is not None:  # the conditioning frame stays the encoded image
            stepped = torch.where(state.frozen.bool().unsqueeze(-1), state.video, stepped)
        state.video = stepped
        state.audio = state.audio + dt * audio_v
        state.index += 1
        return state

    def finalize(self, state: LTX2DenoiseState) -> dict[str, Any]:
        if not (torch.isfinite(state.video).all() and torch.isfinite(state.audio).all()):
            raise NonFiniteOutput.of("denoising", self.dtype)
        state.prompts.clear()
        return {"video_latents": state.video, "audio_latents": state.audio}
