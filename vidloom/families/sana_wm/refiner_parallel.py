"""SANA-WM's stage-2 refiner under sequence parallel: the active chunk's tokens split over the ranks, the window by
heads.

The refiner's forward (refiner.py) attends the chunk's queries to [sink, history, chunk] keys. Under --sp K rank r
keeps a contiguous 1/K of the chunk's video tokens (the chunk padded with zero rows at its end when K does not divide
them, as LTX-2's streams are: runtime.parallel.ulysses.TokenShards.shard_joint), and the projections, norms, text
cross-attention and feed-forward run on those rows as they are. Around self-attention one all-to-all turns the
chunk's q, k, v (after the q/k RMS norms, which read every head of a token) into every chunk token x heads/K
(Ulysses, as LTX-2's video self-attention); the pad rows are dropped there. From then on a rank works on its heads
alone: rotary (its heads' slice of the tables), the sink / history capture, the window's keys and the attention, so
the window (RefinerWindow) holds heads/K of every window token on each rank and its bytes per rank drop by K. A
second all-to-all brings the output back to the rank's rows and all heads before the gate and the output
projection; the tokens are gathered before the output head. The exchanges copy values, so the only numeric
difference from one device is the blocking of kernels over fewer rows.

The refiner shards over the same sp group as stage 1 (whose FrameRows layout apply_sp set on the stage-1
transformer); where K does not divide the refiner's attention heads it runs whole on every rank, as before
(`whole_reason` says why, and the program logs it at load).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from vidloom.families.sana_wm.parallel import FrameRows
from vidloom.models.ltx2.rope import RopeTables

if TYPE_CHECKING:  # the runtime's exchanges import torch.distributed: only a sharded run needs them
    from vidloom.core.instance import ModelInstance
    from vidloom.runtime.parallel.comm import Comm


class ChunkLayout(Protocol):
    """Where the refiner's chunk tokens and its window's heads live: whole here (WHOLE_CHUNK) or over K ranks."""

    size: int
    """Ranks the heads split over (1: whole)."""

    def shard(self, tokens: Tensor) -> Tensor:
        """The chunk's tokens [B, N, C] -> this rank's rows [B, n, C]."""
        ...

    def gather(self, tokens: Tensor, length: int) -> Tensor:
        """Every rank's rows [B, n, C] -> the chunk's `length` tokens [B, N, C], pad rows dropped."""
        ...

    def to_heads(self, projected: tuple[Tensor, ...], heads: int, length: int) -> tuple[Tensor, ...]:
        """Each of q, k, v [B, n, H*D] (this rank's rows) -> [B, N, H/K*D] (the chunk's `length` tokens, this rank's
        heads)."""
        ...

    def to_tokens(self, out: Tensor, rows: int) -> Tensor:
        """Attention output [B, N, H/K, D] -> [B, rows, H, D] (this rank's rows, all heads)."""
        ...

    def head_rope(self, tables: RopeTables, layout: str) -> RopeTables:
        """This rank's heads' slice of whole rotary tables (rope.RopeTables, `layout` "interleaved" or "split")."""
        ...


class WholeChunk:
    """Every token and head on this device: each method is the identity."""

    size = 1

    def shard(self, tokens: Tensor) -> Tensor:
        return tokens

    def gather(self, tokens: Tensor, length: int) -> Tensor:
        return tokens

    def to_heads(self, projected: tuple[Tensor, ...], heads: int, length: int) -> tuple[Tensor, ...]:
        return projected

    def to_tokens(self, out: Tensor, rows: int) -> Tensor:
        return out

    def head_rope(self, tables: RopeTables, layout: str) -> RopeTables:
        return tables


WHOLE_CHUNK = WholeChunk()


class ChunkShards:
    """A ChunkLayout over `comm`: rank r keeps tokens [r*n, (r+1)*n) of the chunk padded to K*n, and heads
    [r*H/K, (r+1)*H/K) of every token after to_heads."""

    def __init__(self, comm: Comm) -> None:
        from vidloom.runtime.parallel.ulysses import TokenShards

        self.comm = comm
        self.size = comm.size
        self.rows = TokenShards(comm)

    def shard(self, tokens: Tensor) -> Tensor:
        return self.rows.shard_joint(tokens, (), 0).tokens

    def gather(self, tokens: Tensor, length: int) -> Tensor:
        return self.rows.gather_joint(tokens, length)

    def to_heads(self, projected: tuple[Tensor, ...], heads: int, length: int) -> tuple[Tensor, ...]:
        from vidloom.runtime.parallel.ulysses import seq_to_heads

        # One exchange for q, k and v together; the gathered rows are in rank order == token order, pads last.
        stacked = torch.stack(projected).unflatten(-1, (heads, -1))  # [3, B, n, H, D]
        mine = seq_to_heads(stacked, self.comm)[:, :, :length]  # [3, B, N, H/K, D]
        return tuple(mine.flatten(-2).unbind(0))

    def to_tokens(self, out: Tensor, rows: int) -> Tensor:
        from vidloom.runtime.parallel.ulysses import heads_to_seq

        pad = rows * self.size - out.shape[1]
        if pad:  # the pad rows' outputs: zeros, cut off before the head
            out = torch.cat([out, out.new_zeros((out.shape[0], pad, *out.shape[2:]))], dim=1)
        return heads_to_seq(out, self.comm)

    def head_rope(self, tables: RopeTables, layout: str) -> RopeTables:
        if layout == "interleaved":  # (rotations [B, S, H*D/2, 2],): a head's channel pairs are contiguous
            (rotations,) = tables
            share = rotations.shape[2] // self.size
            return (rotations[:, :, self.comm.rank * share: (self.comm.rank + 1) * share],)
        cos, sin = tables  # [B, H, S, D/2] each
        share = cos.shape[1] // self.size
        mine = slice(self.comm.rank * share, (self.comm.rank + 1) * share)
        return cos[:, mine], sin[:, mine]


def whole_reason(instance: ModelInstance) -> str | None:
    """Why the refiner runs whole on every rank of an sp group (K does not divide its heads); None where it shards
    or where no sp group runs."""
    rows = instance["transformer"].sequence
    if not isinstance(rows, FrameRows):
        return None
    heads = instance["refiner"].config.num_attention_heads
    if heads % rows.comm.size == 0:
        return None
    return (f"the --two-stage refiner's {heads} attention heads do not split over sp={rows.comm.size} ranks "
            f"(its window is kept per head shard): the refiner runs whole on every rank")


def refiner_layout(instance: ModelInstance) -> ChunkLayout:
    """The refiner's layout on this rank: over stage 1's sp group where its size divides the refiner's heads."""
    rows = instance["transformer"].sequence
    if not isinstance(rows, FrameRows) or whole_reason(instance) is not None:
        return WHOLE_CHUNK
    return ChunkShards(rows.comm)
