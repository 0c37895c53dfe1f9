"""Where a DiT's token sequence lives: whole on this device (default), or split across ranks.

A model calls `shard` right after patchifying and `gather` right before its output head;
everything between runs on whatever part of the sequence `shard` kept. The default does
nothing, so single-device models pay one attribute lookup. Sequence parallelism swaps in
a layout from outside the model (vidloom.runtime.parallel.ulysses.apply_sp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor


@dataclass(frozen=True)
class JointPart:
    """This rank's part of a joined sequence [prefix stream (an MMDiT's text), the other streams]."""

    tokens: Tensor
    """[B, S_local, D]: this rank's rows of the (padded) sequence."""
    tables: tuple[Tensor, ...]
    """The same rows of each per-token table [S, ...] (RoPE)."""
    prefix: int
    """How many of this rank's rows belong to the prefix stream (they come first)."""
    length: int
    """Tokens of the whole sequence before any padding (gather_joint cuts back to it)."""
    key_mask: Tensor | None
    """[S_padded] bool on the CPU, True for real tokens, when the sequence was padded to split; attention
    passes it as its mask so the padding is no key (the Ulysses wrapper drops it); None: no padding."""


class SequenceLayout(Protocol):
    """Splits tokens [B, S, D] (and per-token tables [S, ...]) across ranks and joins them again."""

    def shard(self, tokens: Tensor, tables: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        """This rank's tokens [B, S_local, D] and the matching rows of each table [S_local, ...]."""
        ...

    def gather(self, tokens: Tensor) -> Tensor:
        """The whole sequence [B, S, D] from every rank's [B, S_local, D], in token order."""
        ...

    def shard_joint(self, tokens: Tensor, tables: tuple[Tensor, ...], prefix: int) -> JointPart:
        """Like shard, for a sequence whose first `prefix` tokens are another stream; pads it to split."""
        ...

    def gather_joint(self, tokens: Tensor, length: int) -> Tensor:
        """gather, then the first `length` tokens (the padding shard_joint added is dropped)."""
        ...


class WholeSequence:
    """Every token on this device: shard and gather are the identity."""

    def shard(self, tokens: Tensor, tables: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        return tokens, tables

    def gather(self, tokens: Tensor) -> Tensor:
        return tokens

    def shard_joint(self, tokens: Tensor, tables: tuple[Tensor, ...], prefix: int) -> JointPart:
        return JointPart(tokens, tables, prefix, tokens.shape[1], None)

    def gather_joint(self, tokens: Tensor, length: int) -> Tensor:
        return tokens


WHOLE_SEQUENCE = WholeSequence()
"""Stateless default layout, shared by every model."""
