"""SANA-WM stage 1: flow-match Euler over all latent frames at once, the first frame held clean.

Per-frame timesteps (LTX style): the conditioning first frame runs at t = 0 and is never stepped; every
other frame runs at the step's t. CFG runs negative and positive prompts as one batch of two, as the
pipeline does. The step itself follows SanaWMPipeline's per-token FlowMatchEulerDiscreteScheduler step:
dt = t / 1000 - sigma_next, x <- x - dt * prediction.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.denoiser import DenoiseInputs
from vidloom.core.errors import NonFiniteOutput
from vidloom.core.loop import DONE, NETWORK, Done, LoopContext, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.flow_euler import FlowEulerSampler
from vidloom.diffusion.guidance import GuidanceScale, TwoBranchCFG, cfg_combine
from vidloom.diffusion.prompt_kv import PreparedPrompts
from vidloom.diffusion.sampler import Schedule
from vidloom.families.sana_wm.transformer import SanaWMConditioning, SanaWMTransformer
from vidloom.families.sana_wm.text import SanaWMText


@dataclass(frozen=True)
class CameraTensors:
    """What the DiT reads of one request's camera, batch 1."""

    raymap: Tensor  # [1, T_lat, 20]
    plucker: Tensor  # [1, 6 * t_stride, T_lat, h, w]


class SanaWMNetwork:
    """(latents, per-frame timesteps, text) -> prediction, for one request's camera (or stacked requests' cameras),
    repeated over the CFG branches."""

    def __init__(self, transformer: SanaWMTransformer, camera: CameraTensors, dtype: torch.dtype) -> None:
        self.transformer, self.camera, self.dtype = transformer, camera, dtype

    def batch_key(self) -> tuple[Any, ...]:
        """runtime.batching: networks of equal keys stack (same DiT and dtype, cameras of one shape)."""
        return (id(self.transformer), self.dtype, tuple(self.camera.raymap.shape), tuple(self.camera.plucker.shape))

    @staticmethod
    def stack(views: list[SanaWMNetwork]) -> SanaWMNetwork:
        camera = CameraTensors(torch.cat([v.camera.raymap for v in views]), torch.cat([v.camera.plucker for v in views]))
        return SanaWMNetwork(views[0].transformer, camera, views[0].dtype)

    def graph_split(self) -> tuple[Any, tuple[CameraTensors]]:
        """core.denoiser.GraphInputs: a captured step reads this request's camera tensors."""
        return (id(self.transformer), self.dtype), (self.camera,)

    def graph_rebuild(self, parts: tuple[CameraTensors]) -> SanaWMNetwork:
        return SanaWMNetwork(self.transformer, parts[0], self.dtype)

    def __call__(self, latents: Tensor, timestep: Tensor, text: SanaWMText) -> Tensor:
        stream, cond = self.embed(latents, timestep, text)
        return self.head(self.run_blocks(stream, cond), cond)

    # The staged denoiser contract (core.denoiser.StagedDenoiser): __call__ is exactly their composition, so step
    # caches and compiled blocks reach stage 1. The stage-2 refiner is not staged: its forward writes the sink and
    # history K/V that later chunks read (refiner.RefinerWindow), which a skipped block would leave stale.

    @property
    def num_blocks(self) -> int:
        return self.transformer.num_blocks

    def prepare_prompt(self, text: SanaWMText) -> SanaWMText:
        """`text` with every block's cross-attention keys/values (core.denoiser.PreparesPrompt): the steps read them
        instead of projecting the embeddings; `text` itself where the blocks' weights are sharded away."""
        kv = self.transformer.prepare_prompt(text.embeds.to(self.dtype))
        return text if kv is None else dataclasses.replace(text, kv=kv)

    def embed(self, latents: Tensor, timestep: Tensor, text: SanaWMText) -> tuple[Tensor, SanaWMConditioning]:
        b = latents.shape[0] // self.camera.raymap.shape[0]  # the CFG branches repeat the requests' rows
        raymap = self.camera.raymap.repeat(b, 1, 1).to(self.dtype)
        plucker = self.camera.plucker.repeat(b, 1, 1, 1, 1).to(self.dtype)
        prompt = text.embeds.to(self.dtype) if text.kv is None else text.kv
        return self.transformer.embed(latents.to(self.dtype), timestep, prompt, text.mask, raymap, plucker)

    def run_blocks(self, x: Tensor, cond: SanaWMConditioning, start: int = 0, end: int | None = None) -> Tensor:
        return self.transformer.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: SanaWMConditioning, index: int = 0) -> Tensor:
        return self.transformer.block_input(x, cond, index)

    def head(self, x: Tensor, cond: SanaWMConditioning) -> Tensor:
        return self.transformer.head(x, cond)


def guided_prediction(network: SanaWMNetwork, latents: Tensor, timestep: Tensor, text: SanaWMText,
                      guidance_scale: GuidanceScale | None) -> Tensor:
    """One step body. With CFG `text` holds [negative, positive] and both run as one batch; the scale is a float,
    or its 0-dim float32 tensor when the step is replayed from a CUDA graph (cfg_combine: the same bits)."""
    if guidance_scale is None:
        return network(latents, timestep, text).float()
    both = network(latents.repeat(2, 1, 1, 1, 1), timestep.repeat(2, 1), text)
    uncond, cond = both.chunk(2)
    return cfg_combine(cond, uncond, guidance_scale).float()


class BranchPrediction:
    """The step body when a policy runs the two CFG branches (a --cfg-parallel rank pair's ParallelCFG: the
    positive prompt on one rank, the negative on the other, predictions exchanged); the same combine."""

    def __init__(self, branches: TwoBranchCFG) -> None:
        self.branches = branches

    def __call__(self, network: SanaWMNetwork, latents: Tensor, timestep: Tensor, text: SanaWMText,
                 guidance_scale: GuidanceScale | None) -> Tensor:
        if guidance_scale is None:
            return network(latents, timestep, text).float()
        negative, positive = text.halves()
        cond, uncond = self.branches.branches(network, latents, timestep, positive, negative)
        return cfg_combine(cond, uncond, guidance_scale).float()


# Per sample: the latents, their per-frame timesteps, the text (both branches, SanaWMText.stack); the scale per request.
STAGE1_INPUTS = DenoiseInputs(("latents", "timestep", "text"), ("guidance_scale",))


@dataclass
class SanaWMDenoiseState:
    latents: Tensor  # float32 [1, C, F, h, w]; frame 0 is the encoded first image
    schedule: Schedule
    network: SanaWMNetwork
    text: SanaWMText
    guidance_scale: float | None  # None: no CFG
    index: int = 0
    prompts: PreparedPrompts = field(default_factory=PreparedPrompts)  # the text's block K/V, once per request


class SanaWMDenoiseLoop:
    """Reads `request`, `latents`, `camera`, `text`; writes `latents`."""

    name = "stage1"

    def __init__(self, transformer: SanaWMTransformer, sampler: FlowEulerSampler, dtype: torch.dtype,
                 guidance: TwoBranchCFG | None = None) -> None:
        self.transformer, self.sampler, self.dtype = transformer, sampler, dtype
        self.step = guided_prediction if guidance is None else BranchPrediction(guidance)

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> SanaWMDenoiseState:
        request: GenerationRequest = slots["request"]
        cfg = request.uses_cfg
        return SanaWMDenoiseState(
            latents=slots["latents"], schedule=self._sampler(request).schedule(request.num_inference_steps),
            network=SanaWMNetwork(self.transformer, slots["camera"], self.dtype), text=slots["text"],
            guidance_scale=float(request.guidance_scale) if cfg else None)

    def _sampler(self, request: GenerationRequest) -> FlowEulerSampler:
        """The checkpoint's scheduler with the request's flow shift (the card's default is the scheduler's)."""
        return FlowEulerSampler(self.sampler.config.with_shift(float(request.flow_shift)))

    def next(self, state: SanaWMDenoiseState) -> StepPlan | Done:
        total = state.schedule.num_steps
        if state.index >= total:
            return DONE
        t = state.schedule.timesteps[state.index]
        frames = state.latents.shape[2]
        timestep = t.expand(1, frames).clone()
        timestep[:, 0] = 0.0  # the conditioning frame is clean
        inputs = {NETWORK: state.network, "latents": state.latents, "timestep": timestep.to(state.latents.device),
                  "text": state.prompts.get(state.network, state.text), "guidance_scale": state.guidance_scale}
        return StepPlan(loop=self.name, index=state.index, total=total, call=self.step, denoiser=STAGE1_INPUTS,
                        inputs=inputs)

    def advance(self, state: SanaWMDenoiseState, result: Tensor) -> SanaWMDenoiseState:
        n_train = self.sampler.config.num_train_timesteps
        t = state.schedule.timesteps[state.index]
        dt = (t / n_train - state.schedule.sigmas[state.index + 1]).to(state.latents.device)
        stepped = state.latents + dt * -result
        state.latents = torch.cat([state.latents[:, :, :1], stepped[:, :, 1:]], dim=2)
        state.index += 1
        return state

    def finalize(self, state: SanaWMDenoiseState) -> dict[str, Any]:
        if not torch.isfinite(state.latents).all():
            raise NonFiniteOutput.of("denoising", self.dtype)
        return {"latents": state.latents}
