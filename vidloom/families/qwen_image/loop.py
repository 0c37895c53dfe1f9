"""Qwen-Image's denoise loop: flow-match Euler over packed 2x2 latent patches; the step body is true CFG (its two
branches one after the other, or batched in one forward with the shorter prompt padded and masked)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from vidloom.core.loop import LoopContext
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guided_euler import GuidedEulerState, GuidedEulerSteps
from vidloom.diffusion.guidance import GuidancePolicy, SequentialCFG
from vidloom.families.qwen_image.guidance import NormRescaledCFG
from vidloom.families.qwen_image.schedule import QwenImageSchedule
from vidloom.families.qwen_image.transformer import QwenImageConditioning, QwenImageTransformer


@dataclass(frozen=True)
class QwenImageLayout:
    """One request's token layout: the (h, w) token grids (target, then the reference) and the reference's
    packed latents (None: text to image)."""

    grids: tuple[tuple[int, int], ...]
    references: Tensor | None = None


@dataclass(frozen=True)
class QwenImageNetwork:
    """The Network a guidance policy calls for one request: (latents, timestep, text) -> velocity.

    Holds the request's token grids (target first) and its reference image's packed latents (editing), so
    nothing per request lives on the shared module. A frozen dataclass: CUDA graphs key on the grids and read
    `references` as an input; requests with equal grids stack (batch_key).
    """

    transformer: QwenImageTransformer
    grids: tuple[tuple[int, int], ...]  # (h, w) token grids: the target's, then the references'
    references: Tensor | None = None  # [B, R, C * 4] packed reference latents, or None (text to image)
    # [2, L] bool: the (cond, uncond) rows' real text tokens when batched CFG padded the shorter prompt; None: unpadded
    text_mask: Tensor | None = None

    def batch_key(self) -> tuple[Any, ...]:
        return (id(self.transformer), self.grids)

    @staticmethod
    def stack(views: list[QwenImageNetwork]) -> QwenImageNetwork:
        first = views[0]
        if first.references is None:
            return first
        return dataclasses.replace(first, references=torch.cat([v.references for v in views], dim=0))

    @property
    def num_target(self) -> int:
        h, w = self.grids[0]
        return h * w

    def tokens(self, latents: Tensor) -> Tensor:
        """The target's tokens, then the reference's (repeated when CFG branches stack the batch)."""
        if self.references is None:
            return latents
        refs = self.references.to(latents.dtype)
        return torch.cat([latents, refs.repeat(latents.shape[0] // refs.shape[0], 1, 1)], dim=1)

    def __call__(self, latents: Tensor, timestep: Tensor, text: Tensor) -> Tensor:
        return self.transformer(self.tokens(latents), text, timestep, self.grids,
                                text_mask=self.text_mask)[:, : self.num_target]

    # The staged denoiser contract (core.denoiser.StagedDenoiser): __call__ is their composition.

    @property
    def num_blocks(self) -> int:
        return self.transformer.num_blocks

    def embed(self, latents: Tensor, timestep: Tensor, text: Tensor) -> tuple[Tensor, QwenImageConditioning]:
        return self.transformer.embed(self.tokens(latents), text, timestep, self.grids, text_mask=self.text_mask)

    def run_blocks(self, x: Tensor, cond: QwenImageConditioning, start: int = 0, end: int | None = None) -> Tensor:
        return self.transformer.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: QwenImageConditioning, index: int = 0) -> Tensor:
        return self.transformer.block_input(x, cond, index)

    def head(self, x: Tensor, cond: QwenImageConditioning) -> Tensor:
        return self.transformer.head(x, cond)[:, : self.num_target]


class QwenImageDenoiseLoop(GuidedEulerSteps):
    """Flow-matching Euler loop over a shared QwenImageTransformer."""

    name = "denoise"

    def __init__(self, transformer: QwenImageTransformer, schedule: QwenImageSchedule, dtype: torch.dtype,
                 guidance: GuidancePolicy | None = None, pad_cfg: bool = False) -> None:
        self.transformer = transformer
        self.schedule = schedule
        self.dtype = dtype
        self.guidance = guidance or NormRescaledCFG(SequentialCFG())
        self.pad_cfg = pad_cfg  # the guidance batches both branches: pad the shorter prompt, mask its padding

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> GuidedEulerState:
        request: GenerationRequest = slots["request"]
        latents: Tensor = slots["latents"]
        layout: QwenImageLayout = slots["layout"]
        grids = layout.grids
        prompt, negative = slots["prompt_embeds"].to(self.dtype), slots["negative_embeds"]
        negative = None if negative is None else negative.to(self.dtype)
        text_mask = None
        if self.pad_cfg and negative is not None and negative.shape[1] != prompt.shape[1]:
            prompt, negative, text_mask = pad_pair(prompt, negative)
        h, w = grids[0]
        return GuidedEulerState(
            latents=latents,
            sigmas=self.schedule.sigmas(request.num_inference_steps, h * w),  # mu counts target tokens only
            network=QwenImageNetwork(self.transformer, grids, layout.references, text_mask),
            prompt_embeds=prompt,
            negative_embeds=negative,
            guidance_scale=float(request.guidance_scale),
        )


def pad_pair(prompt: Tensor, negative: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """[1, Lp, D] and [1, Ln, D] zero-padded at their end to one length (the pipeline's own padding), and the
    [2, L] mask of their real tokens, rows (prompt, negative): the batched CFG forward's order."""
    length = max(prompt.shape[1], negative.shape[1])
    positions = torch.arange(length, device=prompt.device)
    mask = torch.stack([positions < prompt.shape[1], positions < negative.shape[1]])
    return (F.pad(prompt, (0, 0, 0, length - prompt.shape[1])), F.pad(negative, (0, 0, 0, length - negative.shape[1])),
            mask)
