"""Where a DiT's token sequence lives: whole on this device (default), or split across ranks.

A model calls `shard` right after patchifying and `gather` right before its output head;
everything between runs on whatever part of the sequence `shard` kept. The default does
nothing, so single-device models pay one attribute lookup. Sequence parallelism swaps in
a layout from outside the model (vidloom.runtime.parallel.ulysses.apply_sp).
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class SequenceLayout(Protocol):
    """Splits tokens [B, S, D] (and per-token tables [S, ...]) across ranks and joins them again."""

    def shard(self, tokens: Tensor, tables: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        """This rank's tokens [B, S_local, D] and the matching rows of each table [S_local, ...]."""
        ...

    def gather(self, tokens: Tensor) -> Tensor:
        """The whole sequence [B, S, D] from every rank's [B, S_local, D], in token order."""
        ...


class WholeSequence:
    """Every token on this device: shard and gather are the identity."""

    def shard(self, tokens: Tensor, tables: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        return tokens, tables

    def gather(self, tokens: Tensor) -> Tensor:
        return tokens


WHOLE_SEQUENCE = WholeSequence()
"""Stateless default layout, shared by every model."""
