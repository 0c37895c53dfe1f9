"""A request's prompt as AnyFlow-FAR's blocks read it: every layer's cross-attention keys and values, projected once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from vidloom.layers.prompt_kv import PromptKV


@dataclass(frozen=True)
class FarText(PromptKV):
    """The shared prompt K/V (layers.prompt_kv.PromptKV: keys/values [B, L, H, Dh] per layer, B the CFG branches),
    projected once per request by `FarTransformer.embed_text`: the text is the same at every step and chunk.

    Only the stacking differs: a batched rollout step lays its rows out CFG-branch-major (the uncond rows of every
    request, then the cond rows), as far_step lays out the latents and FarKVStack the caches, so requests stack
    only with requests that have the same CFG branches.
    """

    def batch_key(self) -> tuple:
        """Requests' texts stack when their K/V have the same shapes (CFG branches, tokens), dtype and device."""
        first = self.keys[0]
        return (len(self.keys), tuple(first.shape), first.dtype, first.device)

    @staticmethod
    def stack(texts: Sequence[FarText]) -> FarText:  # type: ignore[override]
        """Several requests' texts as one batched rollout step reads them, CFG-branch-major."""

        def rows(layers: tuple[tuple[Tensor, ...], ...]) -> tuple[Tensor, ...]:
            return tuple(torch.stack(per_request, dim=1).flatten(0, 1) for per_request in zip(*layers))

        return FarText(rows(tuple(t.keys for t in texts)), rows(tuple(t.values for t in texts)))

    def __repr__(self) -> str:
        return "Far" + super().__repr__()
