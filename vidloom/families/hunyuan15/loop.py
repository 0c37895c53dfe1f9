"""HunyuanVideo-1.5's denoise loop: flow-match Euler over the video latent, the transformer reading [noisy
latents, condition latents, mask] (zeros in text to video) at t = sigma x 1000, CFG as the saved guider runs it.

Steps of several requests stack into one forward (runtime.batching): their prompts of any lengths are padded and
masked by stack_prompts, the transformer's own per-sample condition mask.

Eager, the prompts are unpadded, so their lengths are host ints (the tensors' shapes) that the transformer slices by
(ConditionCounts) instead of gathering by masks on the device. Under --cuda-graphs (LoopContext.captures_steps) the
step body is captured, and each CFG branch's text and glyph tokens are padded to their prompt-length buckets instead
(text.bucketed, runtime.prompt_buckets.PROMPT_BUCKET): the graph's shapes are the buckets', the valid counts a tensor
input refilled at each replay, and the transformer masks the padding keys, so one graph serves every prompt length
of a bucket (per video size, as before). The masked attention sums the same keys as the eager forward in another
order: float32 video within 1e-5 of eager (tests/integration/test_hunyuan15_cuda_graphs.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Hashable, Mapping

import torch
from torch import Tensor

from vidloom.core.denoiser import DenoiseInputs
from vidloom.core.loop import DONE, NETWORK, Done, LoopContext, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import SequentialCFG, TwoBranchCFG
from vidloom.diffusion.guided_euler import GuidedEulerSteps
from vidloom.families.hunyuan15.schedule import Hunyuan15Guider, Hunyuan15Schedule
from vidloom.families.hunyuan15.text import PromptEmbeds, bucketed, stack_prompts
from vidloom.families.hunyuan15.transformer import ConditionCounts, Hunyuan15Conditioning, Hunyuan15Transformer


@dataclass(frozen=True)
class Hunyuan15Inputs:
    """One request's fixed inputs beside the noisy latents: condition latents + mask channel [1, C + 1, F, H, W]
    (zeros: text to video) and the image tokens [1, Li, image_dim] (None: text to video)."""

    condition: Tensor
    image: Tensor | None = None
    meanflow: bool = False  # image to video on a meanflow transformer: each step also reads the next step's t


@dataclass(frozen=True)
class Hunyuan15Prompts:
    """The prompts of a forward's rows: one request's, or several requests' stacked (runtime.batching); any
    lengths (stack_prompts pads and masks them)."""

    rows: tuple[PromptEmbeds, ...]

    def batch_key(self) -> tuple[Any, ...]:
        text, glyph = self.rows[0].text, self.rows[0].glyph
        return (text.shape[1], glyph.shape[1], text.dtype, text.device)

    @staticmethod
    def stack(batches: list[Hunyuan15Prompts]) -> Hunyuan15Prompts:
        return Hunyuan15Prompts(tuple(row for batch in batches for row in batch.rows))


# The step's per-sample inputs (stacked across requests) and its per-request scale.
STEP_INPUTS = DenoiseInputs(("latents", "timestep", "prompt", "negative"), ("guidance_scale",))


@dataclass(frozen=True)
class Hunyuan15Network:
    """The network a guidance step calls: (latents, timestep, prompt) -> velocity, `prompt` a Hunyuan15Prompts."""

    transformer: Hunyuan15Transformer
    inputs: Hunyuan15Inputs  # one request's, or several requests' stacked along the batch (stack)
    # meanflow: the step's target t (the next step's, 0 after the last); a 0-dim float32 device tensor in a
    # captured step (graph_split), so one graph serves every step
    timestep_r: float | Tensor | None = None

    def batch_key(self) -> tuple[Any, ...]:
        """Views stack across requests (runtime.batching) with one transformer, one condition shape (video size,
        task) and image-token shape; meanflow ones at one target t."""
        image = self.inputs.image
        return (id(self.transformer), tuple(self.inputs.condition.shape[1:]), self.inputs.condition.dtype,
                None if image is None else tuple(image.shape[1:]), self.inputs.meanflow, self.timestep_r)

    def graph_split(self) -> tuple[Hashable, tuple[Any, ...]]:
        """core.denoiser.GraphInputs: a captured step bakes in the transformer; it reads this request's condition
        latents and image tokens, and the step's target t (a float: a static 0-dim buffer refilled before each
        replay, where a plain field would make a graph per step)."""
        return id(self.transformer), (self.inputs, self.timestep_r)

    def graph_rebuild(self, parts: tuple[Any, ...]) -> Hunyuan15Network:
        return dataclasses.replace(self, inputs=parts[0], timestep_r=parts[1])

    @staticmethod
    def stack(views: list[Hunyuan15Network]) -> Hunyuan15Network:
        first = views[0]
        image = None if first.inputs.image is None else torch.cat([v.inputs.image for v in views])
        inputs = dataclasses.replace(first.inputs, condition=torch.cat([v.inputs.condition for v in views]),
                                     image=image)
        return dataclasses.replace(first, inputs=inputs)

    def _args(self, latents: Tensor, timestep: Tensor, prompt: Hunyuan15Prompts) -> tuple[Any, ...]:
        rows = latents.shape[0]
        prompts = list(prompt.rows) * (rows // len(prompt.rows))
        text, text_mask, glyph, glyph_mask = stack_prompts(prompts)
        padded = any(p.valid is not None for p in prompts)  # bucket-padded (cuda_graphs): the masks mark the padding
        counts = None if padded else ConditionCounts(tuple(p.text.shape[0] for p in prompts),
                                                     tuple(p.glyph.shape[0] for p in prompts))
        condition = self.inputs.condition.to(latents.dtype)
        x = torch.cat([latents, condition.repeat(rows // condition.shape[0], 1, 1, 1, 1)], 1)
        image = self.inputs.image
        if image is not None:
            image = image.to(latents.dtype).repeat(rows // image.shape[0], 1, 1)
        r = self.timestep_r
        if isinstance(r, Tensor):  # a captured step's float32 buffer: the same rounding as full_like from the float
            r = r.to(timestep.dtype).expand(timestep.shape)
        elif r is not None:
            r = torch.full_like(timestep, r)
        return x, timestep, text, text_mask, glyph, glyph_mask, image, r, counts, padded

    def __call__(self, latents: Tensor, timestep: Tensor, prompt: Hunyuan15Prompts) -> Tensor:
        x, cond = self.embed(latents, timestep, prompt)
        return self.head(self.run_blocks(x, cond), cond)

    # The staged denoiser contract (core.denoiser.StagedDenoiser): __call__ is their composition.

    @property
    def num_blocks(self) -> int:
        return self.transformer.num_blocks

    def embed(self, latents: Tensor, timestep: Tensor,
              prompt: Hunyuan15Prompts) -> tuple[Tensor, Hunyuan15Conditioning]:
        return self.transformer.embed(*self._args(latents, timestep, prompt))

    def run_blocks(self, x: Tensor, cond: Hunyuan15Conditioning, start: int = 0, end: int | None = None) -> Tensor:
        return self.transformer.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: Hunyuan15Conditioning, index: int = 0) -> Tensor:
        return self.transformer.block_input(x, cond, index)

    def head(self, x: Tensor, cond: Hunyuan15Conditioning) -> Tensor:
        return self.transformer.head(x, cond)


@dataclass
class Hunyuan15State:
    """One request's denoising; owned by that request alone."""

    latents: Tensor  # float32 [1, C, F, H, W]
    sigmas: Tensor  # float32 [steps + 1]
    network: Hunyuan15Network
    prompt: Hunyuan15Prompts
    negative: Hunyuan15Prompts | None  # None: no CFG at any step
    guidance_scale: float
    index: int = 0


class GuiderStep:
    """The step body: the conditional prediction, and the unconditional one where the guider runs CFG at this
    step, combined by the guider. `branches` runs the two: one after the other (cond first, as the guider orders
    its batches), or one per rank of a --cfg-parallel pair (ParallelCFG)."""

    def __init__(self, guider: Hunyuan15Guider, branches: TwoBranchCFG | None = None) -> None:
        self.guider = guider
        self.branches = branches or SequentialCFG()

    def __call__(self, network: Hunyuan15Network, latents: Tensor, timestep: Tensor, prompt: Hunyuan15Prompts,
                 negative: Hunyuan15Prompts | None, guidance_scale: float | Tensor) -> Tensor:
        if negative is None:
            return network(latents, timestep, prompt)
        cond, uncond = self.branches.branches(network, latents, timestep, prompt, negative)
        return self.guider.combine(cond, uncond, guidance_scale)


class Hunyuan15DenoiseLoop(GuidedEulerSteps):
    """Flow-matching Euler loop over a shared Hunyuan15Transformer (GuidedEulerSteps' Euler update and finish);
    requests of one video size and task share a step's forward (STEP_INPUTS), whatever their prompts."""

    name = "denoise"

    def __init__(self, transformer: Hunyuan15Transformer, schedule: Hunyuan15Schedule, guider: Hunyuan15Guider,
                 dtype: torch.dtype, branches: TwoBranchCFG | None = None) -> None:
        self.transformer, self.schedule, self.guider, self.dtype = transformer, schedule, guider, dtype
        self.step = GuiderStep(guider, branches)

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> Hunyuan15State:
        request: GenerationRequest = slots["request"]
        negative: PromptEmbeds | None = slots["negative_embeds"]
        prompt: PromptEmbeds = slots["prompt_embeds"]
        if ctx.captures_steps:  # one graph per prompt-length bucket, not per prompt length (module docstring)
            prompt, negative = bucketed(prompt), None if negative is None else bucketed(negative)
        return Hunyuan15State(
            latents=slots["latents"],
            sigmas=self.schedule.sigmas(request.num_inference_steps, request.flow_shift),
            network=Hunyuan15Network(self.transformer, slots["inputs"]),
            prompt=Hunyuan15Prompts((prompt,)),
            negative=None if negative is None else Hunyuan15Prompts((negative,)),
            guidance_scale=float(request.guidance_scale),
        )

    def next(self, state: Hunyuan15State) -> StepPlan | Done:
        total = len(state.sigmas) - 1
        if state.index >= total:
            return DONE
        t = state.sigmas[state.index] * self.schedule.num_train_timesteps  # float32, as the scheduler's timesteps
        cfg = state.negative is not None and self.guider.cfg_at(state.index, total, state.guidance_scale)
        network = state.network
        if network.inputs.meanflow:  # float32 t of the next step, as the reference's timesteps[i + 1]
            following = state.sigmas[state.index + 1] * self.schedule.num_train_timesteps
            network = dataclasses.replace(network, timestep_r=float(following))
        return StepPlan(
            loop=self.name, index=state.index, total=total, call=self.step, denoiser=STEP_INPUTS,
            inputs={NETWORK: network, "latents": state.latents.to(self.dtype),
                    "timestep": t.expand(state.latents.shape[0]).to(state.latents.device, self.dtype),
                    "prompt": state.prompt, "negative": state.negative if cfg else None,
                    "guidance_scale": state.guidance_scale},
        )
