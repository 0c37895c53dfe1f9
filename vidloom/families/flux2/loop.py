"""Flux2's denoise loop: flow-match Euler over packed image tokens; the step body is a CFG policy."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.loop import LoopContext
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guided_euler import GuidedEulerState, GuidedEulerSteps
from vidloom.diffusion.guidance import GuidancePolicy, SequentialCFG
from vidloom.families.flux2.transformer import Flux2Transformer
from vidloom.families.flux2.schedule import Flux2Schedule


@dataclass(frozen=True)
class Flux2Tokens:
    """Position ids of one request's token layout, plus its encoded reference images."""

    img_ids: Tensor  # [N + R, 4] (t, h, w, l): target tokens, then reference tokens
    txt_ids: Tensor  # [L, 4]
    num_target: int  # N
    references: Tensor | None  # [B, R, C] packed reference latents (B = 1, or stacked requests), or None
    layout: tuple[Any, ...]  # (h, w, text length, reference grids): equal layouts have equal ids


class Flux2Network:
    """The Network a guidance policy calls for one request: (latents, timestep, text) -> velocity.

    Appends the request's reference tokens, runs the shared transformer, keeps the target
    tokens. Built per request, so the ids and references never live on the shared module.
    """

    def __init__(self, transformer: Flux2Transformer, tokens: Flux2Tokens) -> None:
        self.transformer = transformer
        self.tokens = tokens

    def batch_key(self) -> tuple[Any, ...]:
        """Networks with equal keys stack (runtime.batching): same transformer, same position ids."""
        return (id(self.transformer), self.tokens.layout)

    @staticmethod
    def stack(views: list[Flux2Network]) -> Flux2Network:
        """One network for requests stacked along the batch (equal batch keys): references stacked too."""
        first = views[0].tokens
        refs = None if first.references is None else torch.cat([v.tokens.references for v in views], dim=0)
        return Flux2Network(views[0].transformer, dataclasses.replace(first, references=refs))

    def graph_split(self) -> tuple[Any, tuple[Tensor | None, ...]]:
        """core.denoiser.GraphInputs: a captured step bakes in the transformer and the token layout; it reads
        the ids and this request's reference tokens."""
        t = self.tokens
        return (id(self.transformer), t.layout, t.num_target), (t.img_ids, t.txt_ids, t.references)

    def graph_rebuild(self, parts: tuple[Tensor | None, ...]) -> Flux2Network:
        img_ids, txt_ids, references = parts
        return Flux2Network(self.transformer, dataclasses.replace(self.tokens, img_ids=img_ids, txt_ids=txt_ids,
                                                                  references=references))

    def __call__(self, latents: Tensor, timestep: Tensor, text: Tensor) -> Tensor:
        out = self.transformer(self._tokens(latents), text, timestep, self.tokens.img_ids, self.tokens.txt_ids)
        return out[:, : self.tokens.num_target]

    def _tokens(self, latents: Tensor) -> Tensor:
        refs = self.tokens.references
        if refs is None:
            return latents
        # A stacked network's B references serve B latents; CFG passes may repeat that batch.
        refs = refs.to(latents.dtype).repeat(latents.shape[0] // refs.shape[0], 1, 1)
        return torch.cat([latents, refs], dim=1)

    # The staged denoiser contract (runtime.step_cache.StagedNetwork): __call__ is their composition.

    @property
    def num_blocks(self) -> int:
        return self.transformer.num_blocks

    def embed(self, latents: Tensor, timestep: Tensor, text: Tensor) -> tuple[Tensor, Any]:
        return self.transformer.embed(self._tokens(latents), text, timestep, self.tokens.img_ids, self.tokens.txt_ids)

    def run_blocks(self, x: Tensor, cond: Any, start: int = 0, end: int | None = None) -> Tensor:
        return self.transformer.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: Any, index: int = 0) -> Tensor:
        return self.transformer.block_input(x, cond, index)

    def head(self, x: Tensor, cond: Any) -> Tensor:
        return self.transformer.head(x, cond)[:, : self.tokens.num_target]


class Flux2DenoiseLoop(GuidedEulerSteps):
    """Flow-matching Euler loop over a shared Flux2Transformer."""

    name = "denoise"

    def __init__(
        self, transformer: Flux2Transformer, schedule: Flux2Schedule, dtype: torch.dtype,
        guidance: GuidancePolicy | None = None,
    ) -> None:
        self.transformer = transformer
        self.schedule = schedule
        self.dtype = dtype
        self.guidance = guidance or SequentialCFG()

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> GuidedEulerState:
        request: GenerationRequest = slots["request"]
        latents: Tensor = slots["latents"]
        negative = slots["negative_embeds"]
        return GuidedEulerState(
            latents=latents,
            sigmas=self.schedule.sigmas(request.num_inference_steps, latents.shape[1]),
            network=Flux2Network(self.transformer, slots["tokens"]),
            prompt_embeds=slots["prompt_embeds"].to(self.dtype),
            negative_embeds=None if negative is None else negative.to(self.dtype),
            guidance_scale=float(request.guidance_scale),
        )
