"""The network one Helios denoise step runs, as the runtime's denoiser contract sees it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Hashable

import torch
from torch import Tensor

from vidloom.families.helios.transformer import HeliosConditioning, HeliosHistory, HeliosTransformer


def _rows(history: HeliosHistory, batch: int) -> HeliosHistory:
    """The history repeated to `batch` rows (CFG branches stacked as one batch repeat the requests' rows)."""
    have = history.short.shape[0]
    if batch == have:
        return history
    if batch % have:
        raise ValueError(f"a batch of {batch} latents cannot share {have} histories")
    repeat = lambda t: None if t is None else t.repeat(batch // have, *([1] * (t.ndim - 1)))  # noqa: E731
    return dataclasses.replace(history, short=repeat(history.short), mid=repeat(history.mid),
                               long=repeat(history.long))


@dataclass(frozen=True)
class HeliosNetwork:
    """(latents, timestep, text) -> the chunk's velocity, for one chunk of one request (or a stack of them).

    Binds the chunk's history latents and frame indices, so nothing per request lands on the shared
    transformer. Its cache scope is the chunk: a step cache never reuses one chunk's residual for the next's.
    Requests whose chunks have the same shapes stack into one forward (batch_key / stack). A captured step reads
    the chunk's tensors from static buffers (graph_split), so one graph serves every chunk of a size.
    """

    transformer: HeliosTransformer
    frame_indices: Tensor  # [F] latent frame positions of the chunk
    history: HeliosHistory  # [B, C, T_k, h, w] per term, this request's rows
    cache_scope: int = 0  # the chunk's index

    def batch_key(self) -> tuple[Any, ...]:
        """The frame indices by identity (the loop's, on the device, the same every chunk): no read back per step."""
        h = self.history
        shapes = tuple(None if t is None else tuple(t.shape[1:]) for t in (h.short, h.mid, h.long))
        return (id(self.transformer), id(self.frame_indices), shapes, self.cache_scope)

    def graph_split(self) -> tuple[Hashable, tuple[Any, ...]]:
        """core.denoiser.GraphInputs: a captured step bakes in the transformer (and, through the parts' shapes, the
        chunk's grid: a pyramid stage's size, and which history terms there are); it reads the chunk's frame indices
        and the history's latents and frame indices (a frozen dataclass: its tensors split out), refilled before each
        replay. The cache scope (the chunk's index, read only by step caches, whose steps never replay) stays out, so
        every chunk and request of one size replays one graph, the first chunk's zero history included."""
        return id(self.transformer), (self.frame_indices, self.history)

    def graph_rebuild(self, parts: tuple[Any, ...]) -> HeliosNetwork:
        return dataclasses.replace(self, frame_indices=parts[0], history=parts[1])

    @staticmethod
    def stack(views: list[HeliosNetwork]) -> HeliosNetwork:
        first = views[0]
        cat = lambda name: None if getattr(first.history, name) is None else torch.cat(  # noqa: E731
            [getattr(v.history, name) for v in views])
        history = dataclasses.replace(first.history, short=cat("short"), mid=cat("mid"), long=cat("long"))
        return dataclasses.replace(first, history=history)

    def __call__(self, latents: Tensor, timestep: Tensor, text: Tensor) -> Tensor:
        x, cond = self.embed(latents, timestep, text)
        return self.head(self.run_blocks(x, cond), cond)

    # The staged denoiser contract (core.denoiser.StagedDenoiser); __call__ is their composition.

    @property
    def num_blocks(self) -> int:
        return self.transformer.num_blocks

    def embed(self, latents: Tensor, timestep: Tensor, text: Tensor) -> tuple[Tensor, HeliosConditioning]:
        history = _rows(self.history, latents.shape[0])
        return self.transformer.embed(latents, timestep, text, self.frame_indices, history)

    def run_blocks(self, x: Tensor, cond: HeliosConditioning, start: int = 0, end: int | None = None) -> Tensor:
        return self.transformer.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: HeliosConditioning, index: int = 0) -> Tensor:
        return self.transformer.block_input(x, cond, index)

    def head(self, x: Tensor, cond: HeliosConditioning) -> Tensor:
        return self.transformer.head(x, cond)
