"""One LTX-2 joint block: video and audio streams, each self-, text- and cross-modal attention plus a feed-forward.

The sub-layer order and the modulation arithmetic follow diffusers' LTX2VideoTransformerBlock
step by step (parity at 1e-5); module names are ours (see LTX2_TRANSFORMER_NAME_MAP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn
from vidloom.models.ltx2.layers import Attention, FeedForward, Norm, modulation
from vidloom.models.ltx2.rope import RopeTables

if TYPE_CHECKING:
    from vidloom.models.ltx2.transformer import LTX2TransformerConfig


@dataclass(frozen=True)
class StreamConditioning:
    """One stream's global modulation for every block (per sample [B, 1, k*D] or per token [B, N, k*D])."""

    mod: Tensor  # 6 (or 9 with cross_attn_mod) vectors: self-attn and FF shift/scale/gate (+ text q)
    text_mod: Tensor | None  # 2: text K/V shift/scale (LTX-2.3 with prompt AdaLN), else None
    cross_mod: Tensor  # 4: a2v scale/shift, v2a scale/shift
    cross_gate: Tensor  # 1: the gate of the cross-modal attention this stream receives


TextKV = tuple[Tensor, Tensor, Tensor, Tensor]
"""One block's text keys and values: video k, video v, audio k, audio v (JointBlock.text_kv)."""


class JointBlock(nn.Module):
    def __init__(self, c: LTX2TransformerConfig, attention_fn: AttentionFn) -> None:
        super().__init__()
        dim, adim = c.dim, c.audio_dim
        heads, hd, aheads, ahd = c.num_attention_heads, c.attention_head_dim, c.audio_num_attention_heads, \
            c.audio_attention_head_dim
        common = dict(bias=c.attention_bias, out_bias=c.attention_out_bias, rope_layout=c.rope_type,
                      attention_fn=attention_fn)
        self.video_self = Attention(dim, heads, hd, gated=c.gated_attn, **common)
        self.audio_self = Attention(adim, aheads, ahd, gated=c.audio_gated_attn, **common)
        self.video_text = Attention(dim, heads, hd, kv_dim=c.cross_attention_dim, gated=c.gated_attn, **common)
        self.audio_text = Attention(adim, aheads, ahd, kv_dim=c.audio_cross_attention_dim, gated=c.audio_gated_attn,
                                    **common)
        # audio->video: q video, k/v audio; video->audio: q audio, k/v video. Both at the audio width.
        self.a2v = Attention(dim, aheads, ahd, kv_dim=adim, gated=c.gated_attn, **common)
        self.v2a = Attention(adim, aheads, ahd, kv_dim=dim, gated=c.audio_gated_attn, **common)
        self.video_ff = FeedForward(dim, bias=c.ff_bias)
        self.audio_ff = FeedForward(adim, bias=c.audio_ff_bias)
        eps, affine = c.norm_eps, c.norm_elementwise_affine
        for stream, width in (("video", dim), ("audio", adim)):
            for role in ("self", "text", "cross", "ff"):
                setattr(self, f"{stream}_norm_{role}", Norm(width, eps, affine))
        self.video_text_q = c.cross_attn_mod
        self.audio_text_q = c.audio_cross_attn_mod
        self.video_table = nn.Parameter(torch.zeros(9 if c.cross_attn_mod else 6, dim))
        self.audio_table = nn.Parameter(torch.zeros(9 if c.audio_cross_attn_mod else 6, adim))
        self.text_kv_modulated = c.prompt_modulation
        if self.text_kv_modulated:
            self.video_text_table = nn.Parameter(torch.zeros(2, dim))
            self.audio_text_table = nn.Parameter(torch.zeros(2, adim))
        self.video_cross_table = nn.Parameter(torch.zeros(5, dim))
        self.audio_cross_table = nn.Parameter(torch.zeros(5, adim))

    def forward(
        self, x: Tensor, a: Tensor, video_text: Tensor, audio_text: Tensor, mask: Tensor | None,
        vc: StreamConditioning, ac: StreamConditioning,
        ropes: tuple[RopeTables, RopeTables, RopeTables, RopeTables], *, cross: bool, skip_self: bool,
        text_kv: TextKV | None = None, keys: tuple[Tensor | None, Tensor | None] = (None, None),
    ) -> tuple[Tensor, Tensor]:
        """`text_kv`: this block's text_kv(...) of the same text, computed once for the request (then video_text
        and audio_text are not read). `keys`: the video and audio streams' pad masks under sequence parallel
        (shards.StreamShards: the pad rows are no keys of the attentions that read that stream), else None."""
        batch = x.shape[0]
        video_rope, audio_rope, video_cross_rope, audio_cross_rope = ropes
        vp = modulation(self.video_table, vc.mod, batch)
        ap = modulation(self.audio_table, ac.mod, batch)
        # 1. Self-attention.
        h = self.video_norm_self(x) * (1 + vp[1]) + vp[0]
        x = x + self.video_self(h, mask=keys[0], q_rope=video_rope, skip=skip_self) * vp[2]
        h = self.audio_norm_self(a) * (1 + ap[1]) + ap[0]
        a = a + self.audio_self(h, mask=keys[1], q_rope=audio_rope, skip=skip_self) * ap[2]
        # 2. Text cross-attention (LTX-2.3 also modulates the query and the text keys/values).
        if text_kv is None:
            video_text, audio_text = self._modulated_text(video_text, audio_text, vc.text_mod, ac.text_mod, batch)
            text_kv = (*self.video_text.context_kv(video_text), *self.audio_text.context_kv(audio_text))
        x = x + self._text(self.video_norm_text(x), text_kv[:2], mask, self.video_text,
                           vp if self.video_text_q else None)
        a = a + self._text(self.audio_norm_text(a), text_kv[2:], mask, self.audio_text,
                           ap if self.audio_text_q else None)
        # 3. Audio<->video cross-attention, both from the same normed inputs.
        if cross:
            x, a = self._cross(x, a, vc, ac, batch, video_cross_rope, audio_cross_rope, keys)
        # 4. Feed-forward.
        x = x + self.video_ff(self.video_norm_ff(x) * (1 + vp[4]) + vp[3]) * vp[5]
        a = a + self.audio_ff(self.audio_norm_ff(a) * (1 + ap[4]) + ap[3]) * ap[5]
        return x, a

    def self_attention_input(self, x: Tensor, vc: StreamConditioning) -> Tensor:
        """The modulated video tokens this block's self-attention reads (a step cache's change indicator)."""
        vp = modulation(self.video_table, vc.mod, x.shape[0])
        return self.video_norm_self(x) * (1 + vp[1]) + vp[0]

    def text_kv(self, video_text: Tensor, audio_text: Tensor) -> TextKV:
        """The text keys and values of a block whose text modulation does not change with the timestep (no
        prompt AdaLN: the static table alone, or none), for forward's `text_kv`."""
        video_text, audio_text = self._modulated_text(video_text, audio_text, None, None, video_text.shape[0])
        return (*self.video_text.context_kv(video_text), *self.audio_text.context_kv(audio_text))

    @staticmethod
    def _text(h: Tensor, kv: tuple[Tensor, ...], mask: Tensor | None, attn: Attention,
              q_mod: tuple[Tensor, ...] | None) -> Tensor:
        if q_mod is not None:
            h = h * (1 + q_mod[7]) + q_mod[6]
        out = attn(h, None, mask, kv=(kv[0], kv[1]))
        return out * q_mod[8] if q_mod is not None else out

    def _modulated_text(
        self, video_text: Tensor, audio_text: Tensor, video_mod: Tensor | None, audio_mod: Tensor | None, batch: int,
    ) -> tuple[Tensor, Tensor]:
        if not self.text_kv_modulated:
            return video_text, audio_text
        out = []
        for text, table, mod in ((video_text, self.video_text_table, video_mod),
                                 (audio_text, self.audio_text_table, audio_mod)):
            if mod is not None:
                shift, scale = modulation(table, mod, batch)
            else:  # use_prompt_adaln_single=False: the static table alone (cacheable text K/V)
                shift, scale = table[None, None].to(device=text.device, dtype=text.dtype).unbind(dim=2)
            out.append(text * (1 + scale) + shift)
        return out[0], out[1]

    def _cross(
        self, x: Tensor, a: Tensor, vc: StreamConditioning, ac: StreamConditioning, batch: int,
        video_rope: RopeTables, audio_rope: RopeTables, keys: tuple[Tensor | None, Tensor | None],
    ) -> tuple[Tensor, Tensor]:
        hx, ha = self.video_norm_cross(x), self.audio_norm_cross(a)
        v_a2v_scale, v_a2v_shift, v_v2a_scale, v_v2a_shift = modulation(self.video_cross_table[:4], vc.cross_mod, batch)
        a_a2v_scale, a_a2v_shift, a_v2a_scale, a_v2a_shift = modulation(self.audio_cross_table[:4], ac.cross_mod, batch)
        a2v_gate = modulation(self.video_cross_table[4:], vc.cross_gate, batch)[0]
        v2a_gate = modulation(self.audio_cross_table[4:], ac.cross_gate, batch)[0]
        q, kv = hx * (1 + v_a2v_scale) + v_a2v_shift, ha * (1 + a_a2v_scale) + a_a2v_shift
        x_new = x + a2v_gate * self.a2v(q, kv, keys[1], q_rope=video_rope, k_rope=audio_rope)
        q, kv = ha * (1 + a_v2a_scale) + a_v2a_shift, hx * (1 + v_v2a_scale) + v_v2a_shift
        a_new = a + v2a_gate * self.v2a(q, kv, keys[0], q_rope=audio_rope, k_rope=video_rope)
        return x_new, a_new
