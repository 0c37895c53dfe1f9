"""Qwen-Image's denoise loop: flow-match Euler over packed 2x2 latent patches; the step body is true CFG (its two
branches one after the other, or batched in one forward with the shorter prompt padded and masked).

Prompts of different lengths share one forward the same way wherever they meet: a request's two branches under
batched CFG, and several requests' steps under cross-request batching (QwenImageText.stack pads and masks both)."""

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
class QwenImageText:
    """Encoded prompts as the transformer reads them: [B, L, D] embeddings, rows zero-padded at their end to one
    length when prompts of different lengths were stacked, and then the [B, L] mask of their real tokens.

    Each prompt is encoded unpadded (as the pipeline encodes it); stacking pads: batched CFG's prompt and negative
    prompt, and cross-request batching's prompts (runtime.batching). Padded rows' text positions are unchanged
    (text rotary positions start after the image grids), so a masked row equals its unpadded forward."""

    embeds: Tensor
    mask: Tensor | None = None  # [B, L] bool, True: a real token; None: every token is real
    pads: bool = True  # False: the attention takes no mask (or a sequence-parallel shard): only equal lengths stack

    def batch_key(self) -> tuple[Any, ...]:
        """Texts stack across requests when their widths and dtypes agree, whatever their lengths (unless they
        cannot be padded)."""
        length = () if self.pads else (self.embeds.shape[1],)
        return (*length, self.embeds.shape[2], self.embeds.dtype, self.embeds.device, self.pads)

    @staticmethod
    def stack(texts: list[QwenImageText]) -> QwenImageText:
        """The texts' rows in order, the shorter zero-padded at their end; the mask is None when none was padded."""
        length = max(t.embeds.shape[1] for t in texts)
        if all(t.embeds.shape[1] == length and t.mask is None for t in texts):
            return QwenImageText(torch.cat([t.embeds for t in texts]), None, texts[0].pads)
        assert all(t.pads for t in texts), "texts that cannot be padded stack only at one length"
        embeds = torch.cat([F.pad(t.embeds, (0, 0, 0, length - t.embeds.shape[1])) for t in texts])
        return QwenImageText(embeds, torch.cat([F.pad(t.real_tokens(), (0, length - t.embeds.shape[1]))
                                                for t in texts]), True)

    def real_tokens(self) -> Tensor:
        """[B, L] bool: the mask, or all True."""
        if self.mask is not None:
            return self.mask
        return torch.ones(self.embeds.shape[:2], dtype=torch.bool, device=self.embeds.device)


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

    def batch_key(self) -> tuple[Any, ...]:
        """Views stack across requests (runtime.batching) with one transformer and one token layout: the same
        image size and reference grids (a text-to-image request and an edit never share a forward)."""
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

    def __call__(self, latents: Tensor, timestep: Tensor, text: QwenImageText) -> Tensor:
        return self.transformer(self.tokens(latents), text.embeds, timestep, self.grids,
                                text_mask=text.mask)[:, : self.num_target]

    # The staged denoiser contract (core.denoiser.StagedDenoiser): __call__ is their composition.

    @property
    def num_blocks(self) -> int:
        return self.transformer.num_blocks

    def embed(self, latents: Tensor, timestep: Tensor, text: QwenImageText) -> tuple[Tensor, QwenImageConditioning]:
        return self.transformer.embed(self.tokens(latents), text.embeds, timestep, self.grids, text_mask=text.mask)

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
                 guidance: GuidancePolicy | None = None, pad_text: bool = True) -> None:
        self.transformer = transformer
        self.schedule = schedule
        self.dtype = dtype
        self.guidance = guidance or NormRescaledCFG(SequentialCFG())
        self.pad_text = pad_text  # the attention takes a key mask: prompts of different lengths may share a forward

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> GuidedEulerState:
        request: GenerationRequest = slots["request"]
        layout: QwenImageLayout = slots["layout"]
        negative = slots["negative_embeds"]
        h, w = layout.grids[0]
        return GuidedEulerState(
            latents=slots["latents"],
            sigmas=self.schedule.sigmas(request.num_inference_steps, h * w),  # mu counts target tokens only
            network=QwenImageNetwork(self.transformer, layout.grids, layout.references),
            prompt_embeds=QwenImageText(slots["prompt_embeds"].to(self.dtype), pads=self.pad_text),
            negative_embeds=None if negative is None else QwenImageText(negative.to(self.dtype), pads=self.pad_text),
            guidance_scale=float(request.guidance_scale),
        )
