"""A request's prompt as AnyFlow-FAR's blocks read it: every layer's cross-attention keys and values, projected once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor


@dataclass(frozen=True)
class FarText:
    """A request's prompt as every block's cross-attention reads it: keys/values [B, L, H, Dh] per layer.

    Projected once per request (`FarTransformer.embed_text`): the text is the same at
    every step and chunk, and its K/V projections would otherwise be a quarter of a
    1.3B step's linear work (512 tokens x 2 projections per layer).
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]

    def batch_key(self) -> tuple:
        """Requests' texts stack when their K/V have the same shapes (CFG branches, tokens), dtype and device."""
        first = self.keys[0]
        return (len(self.keys), tuple(first.shape), first.dtype, first.device)

    @staticmethod
    def stack(texts: Sequence[FarText]) -> FarText:
        """Several requests' texts as one batched rollout step reads them: CFG-branch-major rows (the uncond rows of
        every request, then the cond rows), as far_step lays out the latents and FarKVStack the caches."""

        def rows(layers: tuple[tuple[Tensor, ...], ...]) -> tuple[Tensor, ...]:
            return tuple(torch.stack(per_request, dim=1).flatten(0, 1) for per_request in zip(*layers))

        return FarText(rows(tuple(t.keys for t in texts)), rows(tuple(t.values for t in texts)))

    def __repr__(self) -> str:
        # Shapes only: the lockstep record (runtime.parallel.rank) compares plan inputs by repr, and the ranks of a
        # --cfg-parallel pair hold different branches.
        return f"FarText(layers={len(self.keys)}, shape={tuple(self.keys[0].shape)}, dtype={self.keys[0].dtype})"
