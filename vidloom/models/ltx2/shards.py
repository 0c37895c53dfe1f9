"""LTX-2 under sequence parallel: the video and the audio stream each sharded over the ranks, the text whole.

Right after embedding each stream is split on its own (runtime.parallel.ulysses.TokenShards.shard_joint: a stream
that does not split is padded with zero rows at its end), together with every table whose rows follow its tokens:
its rotary tables (self-attention's and the audio<->video ones) and, for an image-to-video request's per-token
timestep, its modulation. The blocks then run on each rank's rows; self-attention sees every token of its stream
through the wrapper sequence parallel puts around it (Ulysses, or ring attention), and the audio<->video attentions
see every key of the other stream through theirs (ulysses.ShardedCrossAttention); the pad rows are no keys of
either (`StreamShards.*_keys`). The text cross-attention needs nothing: its keys are the whole prompt on every rank.
Both streams are gathered before the head, which then runs on every token as on one device.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from torch import Tensor, nn

from vidloom.layers.sequence import WHOLE_SEQUENCE, JointPart, SequenceLayout

if TYPE_CHECKING:
    from vidloom.models.ltx2.blocks import StreamConditioning
    from vidloom.models.ltx2.rope import RopeTables
    from vidloom.models.ltx2.transformer import LTX2Conditioning


@dataclass(frozen=True)
class StreamShards:
    """How one forward's streams lie over the ranks (WHOLE_STREAMS on one device)."""

    video_keys: Tensor | None = None  # [N padded] bool (CPU), True for real video rows; None: not padded
    audio_keys: Tensor | None = None  # the same for the audio rows
    video_length: int = 0  # video rows before padding (the head cuts the gathered stream back to them)
    audio_length: int = 0


WHOLE_STREAMS = StreamShards()


class StreamSharding:
    """The sequence-parallel hooks of the LTX-2 transformer (runtime.parallel.ulysses.apply_sp): `sequence`, and the
    attentions that need every token of a stream."""

    # All rows on this device, unless sequence parallel swapped in a sharded layout from outside.
    sequence: SequenceLayout = WHOLE_SEQUENCE
    blocks: nn.ModuleList

    def self_attentions(self) -> Iterator[nn.Module]:
        """Each block's video and audio self-attention (each over its own stream's tokens)."""
        for block in self.blocks:
            yield from (block.video_self, block.audio_self)

    def cross_attentions(self) -> Iterator[nn.Module]:
        """Each block's audio->video and video->audio attention: queries of one stream, keys of the other."""
        for block in self.blocks:
            yield from (block.a2v, block.v2a)

    def shard_streams(self, stream: tuple[Tensor, Tensor], cond: LTX2Conditioning,
                      rope_layout: str) -> tuple[tuple[Tensor, Tensor], LTX2Conditioning]:
        """This rank's rows of both streams and of every per-token table `cond` holds (identity on one device)."""
        if self.sequence is WHOLE_SEQUENCE:
            return stream, cond
        video_rope, audio_rope, video_cross, audio_cross = cond.ropes
        axis = 1 if rope_layout == "interleaved" else 2  # [B, S, pairs, 2] or [B, heads, S, r] (rope.RopeTables)
        video, (video_rope, video_cross), video_cond = self._shard(stream[0], (video_rope, video_cross), axis,
                                                                   cond.video)
        audio, (audio_rope, audio_cross), audio_cond = self._shard(stream[1], (audio_rope, audio_cross), axis,
                                                                   cond.audio)
        shards = StreamShards(video.key_mask, audio.key_mask, video.length, audio.length)
        return (video.tokens, audio.tokens), replace(
            cond, ropes=(video_rope, audio_rope, video_cross, audio_cross), video=video_cond, audio=audio_cond,
            shards=shards)

    def gather_streams(self, stream: tuple[Tensor, Tensor], shards: StreamShards) -> tuple[Tensor, Tensor]:
        """Every row of both streams, padding dropped (identity on one device)."""
        if self.sequence is WHOLE_SEQUENCE:
            return stream
        return (self.sequence.gather_joint(stream[0], shards.video_length),
                self.sequence.gather_joint(stream[1], shards.audio_length))

    def _shard(self, tokens: Tensor, ropes: tuple[RopeTables, RopeTables], axis: int,
               cond: StreamConditioning) -> tuple[JointPart, tuple[RopeTables, RopeTables], StreamConditioning]:
        # Every table goes through one shard_joint call with its token axis moved first (the layout's [S, ...]);
        # a modulation with one row ([B, 1, k*D]: per sample) holds for every token and stays whole.
        mods = {name: getattr(cond, name) for name in ("mod", "text_mod", "cross_mod", "cross_gate")}
        per_token = [name for name, t in mods.items() if t is not None and t.shape[1] > 1]
        tables = [t.movedim(axis, 0) for rope in ropes for t in rope] + [mods[n].movedim(1, 0) for n in per_token]
        part = self.sequence.shard_joint(tokens, tuple(tables), 0)
        rows = list(part.tables)
        sharded_ropes = []
        for rope in ropes:
            sharded_ropes.append(tuple(rows.pop(0).movedim(0, axis) for _ in rope))
        sharded_mods = {name: rows.pop(0).movedim(0, 1) for name in per_token}
        return part, (sharded_ropes[0], sharded_ropes[1]), replace(cond, **sharded_mods)
