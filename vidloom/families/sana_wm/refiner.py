"""SANA-WM's stage-2 refiner network: an LTX-2 DiT run video-only over a sink + sliding-window KV.

The refiner checkpoint (diffusers `SanaWMLTX2RefinerTransformer3DModel`) has LTX-2's exact parameter
layout, so it loads into our `LTX2Transformer`; only the forward differs, and it lives here: the video
stream alone (self-attention -> text cross-attention -> feed-forward, no audio, no audio<->video), with
self-attention whose queries are the active chunk and whose keys/values are `[sink, history, chunk]`.
The sink K/V are kept before rotary (each window re-rotates them at a sliding offset so they sit right
before the history); history K/V are kept after rotary. The order of operations follows diffusers'
`SanaWMLTX2RefinerAttnProcessor` and block forward step by step (parity needs the same rounding); the
window bookkeeping (`RefinerWindow`) is ours and is held per request by the runtime's cache manager.
Under sequence parallel (refiner_parallel.py) each rank runs the blocks on its rows of the chunk and attends with
its share of the heads, over a window that holds only those heads.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

import torch
from torch import Tensor

from vidloom.families.sana_wm.refiner_parallel import WHOLE_CHUNK, ChunkLayout
from vidloom.models.ltx2.blocks import JointBlock
from vidloom.models.ltx2.layers import Attention, modulation
from vidloom.models.ltx2.rope import RopeTables, apply_rope, rope_tables, video_positions
from vidloom.models.ltx2.transformer import LTX2Transformer, LTX2TransformerConfig


class WindowMode(Enum):
    """What one refiner forward does with the window."""

    ATTEND = "attend"  # a denoise step: attend to [sink, history, chunk]
    CAPTURE_SINK = "capture_sink"  # the clean sink frames alone: keep their pre-rotary K/V as the sink
    CAPTURE_HISTORY = "capture_history"  # a refined chunk at sigma 0: attend, keep its post-rotary K/V


class RefinerWindow:
    """The sink + sliding-window KV of one refiner rollout, preallocated (its bytes are fixed at admission).

    `sink` [layers, 2, B, sink tokens, inner] holds pre-rotary K/V; `history` [layers, 2, B, capacity, inner]
    holds the newest post-rotary K/V, `filled` tokens of it, oldest first. Appending past the capacity
    keeps the newest `capacity` tokens, which is what concatenating and trimming (the reference) keeps.
    `sink_rope`: the sink's rotary tables for the chunk being refined; `captured`: the K/V per layer of
    the last capturing forward, until stored.
    """

    def __init__(self, layers: int, batch: int, inner: int, sink_tokens: int, capacity_tokens: int,
                 tokens_per_frame: int, device: torch.device, dtype: torch.dtype) -> None:
        self.sink = torch.zeros(layers, 2, batch, sink_tokens, inner, device=device, dtype=dtype)
        self.history = torch.zeros(layers, 2, batch, capacity_tokens, inner, device=device, dtype=dtype)
        self.tokens_per_frame = tokens_per_frame
        self.filled = 0
        self.has_sink = False
        self.sink_rope: RopeTables | None = None
        self.captured: list[tuple[Tensor, Tensor]] = []

    @staticmethod
    def nbytes_for(layers: int, batch: int, inner: int, sink_tokens: int, capacity_tokens: int,
                   dtype: torch.dtype) -> int:
        return 2 * layers * batch * inner * (sink_tokens + capacity_tokens) * dtype.itemsize

    @property
    def nbytes(self) -> int:
        return (self.sink.numel() + self.history.numel()) * self.sink.element_size()

    @property
    def history_frames(self) -> int:
        return self.filled // self.tokens_per_frame

    def layer_kv(self, layer: int) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
        """(sink k, sink v, history k, history v) of one block; None where empty."""
        sink = (self.sink[layer, 0], self.sink[layer, 1]) if self.has_sink and self.sink.shape[3] else (None, None)
        hist = self.history[layer, :, :, : self.filled]
        history = (hist[0], hist[1]) if self.filled else (None, None)
        return (*sink, *history)

    def store_sink(self) -> None:
        """The last CAPTURE_SINK forward's K/V become the sink."""
        for layer, (k, v) in enumerate(self._take()):
            self.sink[layer, 0].copy_(k)
            self.sink[layer, 1].copy_(v)
        self.has_sink = True

    def append_history(self) -> None:
        """The last CAPTURE_HISTORY forward's K/V join the history; past capacity the oldest tokens go."""
        captured = self._take()
        n, cap = captured[0][0].shape[1], self.history.shape[3]
        new = min(n, cap)
        keep_old = min(self.filled, cap - new)  # the newest tokens already held that still fit
        if 0 < keep_old < self.filled:  # slide the survivors to the front
            self.history[:, :, :, :keep_old] = self.history[:, :, :, self.filled - keep_old: self.filled].clone()
        for layer, (k, v) in enumerate(captured):
            self.history[layer, 0, :, keep_old: keep_old + new] = k[:, n - new:]
            self.history[layer, 1, :, keep_old: keep_old + new] = v[:, n - new:]
        self.filled = keep_old + new

    def _take(self) -> list[tuple[Tensor, Tensor]]:
        if len(self.captured) != self.sink.shape[0]:
            raise RuntimeError("no K/V captured by the last refiner forward")
        captured, self.captured = self.captured, []
        return captured


def check_refiner_config(config: LTX2TransformerConfig) -> None:
    """The refiner forward projects the caption and skips LTX-2.3's text AdaLN: refuse other configs."""
    if not config.use_prompt_embeddings:
        raise ValueError("refiner transformer config use_prompt_embeddings=False is not supported "
                         "(the refiner projects the connectors' output itself)")
    if config.cross_attn_mod:
        raise ValueError("refiner transformer config cross_attn_mod=True is not supported "
                         "(the refiner's text cross-attention is unmodulated)")


def frame_rope(dit: LTX2Transformer, batch: int, first_frame: int, frames: int, height: int, width: int,
               fps: float, device: torch.device) -> RopeTables:
    """Video rotary tables for latent frames first_frame .. first_frame + frames - 1 (absolute indices)."""
    c = dit.config
    positions = video_positions(batch, frames, height, width, patch_t=c.patch_size_t, patch=c.patch_size,
                                scale=c.vae_scale_factors, causal_offset=c.causal_offset, fps=fps, device=device,
                                first_frame=first_frame)
    return rope_tables(positions, (c.pos_embed_max_pos, c.base_height, c.base_width), dit.video_rope)


def refiner_velocity(dit: LTX2Transformer, tokens: Tensor, text: Tensor, text_mask: Tensor | None,
                     timestep: Tensor, rope: RopeTables, window: RefinerWindow, mode: WindowMode,
                     shards: ChunkLayout = WHOLE_CHUNK) -> Tensor:
    """Velocity [B, N, C] of the chunk's packed tokens [B, N, C] at timestep [B] (sigma x multiplier).
    text: the connectors' video output [B, L, caption width]; text_mask [B, L], 1 = attend. `rope`: the chunk's
    whole rotary tables; `shards`: this rank's part of the chunk and of the heads (the window holds those heads)."""
    batch, length = tokens.shape[:2]
    # 1. Timestep modulation (one sigma for every token of the chunk) and the projected prompt.
    mod, embedded = dit.video_time(timestep, batch, tokens.dtype)
    text = dit.video_caption(text).view(batch, -1, dit.config.dim)
    mask = None if text_mask is None else ((1 - text_mask.to(tokens.dtype)) * -10000.0)[:, None, None, :]
    # 2. Video-only blocks over the window, on this rank's rows; attention on its heads' rotary tables.
    layout = dit.video_rope.layout
    sink_rope = None if window.sink_rope is None else shards.head_rope(window.sink_rope, layout)
    attend = _Attend(shards.head_rope(rope, layout), sink_rope, window, mode, shards, length)
    x = dit.video_in(shards.shard(tokens))
    window.captured = []
    for i, block in enumerate(dit.blocks):
        x = _block(block, x, text, mask, mod, window.layer_kv(i), attend)
    # 3. Every token again, then the output modulation and projection.
    return dit._out(shards.gather(x, length), embedded, dit.video_out_table, dit.video_out)


LayerKV = tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]


class _Attend(NamedTuple):
    """What every block's windowed self-attention of one forward reads."""

    rope: RopeTables  # the chunk's, this rank's heads
    sink_rope: RopeTables | None  # the sink's (slid before the history), this rank's heads
    window: RefinerWindow
    mode: WindowMode
    shards: ChunkLayout
    length: int  # the chunk's tokens (before any padding)


def _block(block: JointBlock, x: Tensor, text: Tensor, mask: Tensor | None, mod: Tensor, layer: LayerKV,
           attend: _Attend) -> Tensor:
    p = modulation(block.video_table, mod, x.shape[0])
    h = block.video_norm_self(x) * (1 + p[1]) + p[0]
    x = x + _window_attention(block.video_self, h, layer, attend) * p[2]
    x = x + block.video_text(block.video_norm_text(x), text, mask)
    return x + block.video_ff(block.video_norm_ff(x) * (1 + p[4]) + p[3]) * p[5]


def _window_attention(attn: Attention, h: Tensor, layer: LayerKV, attend: _Attend) -> Tensor:
    """Queries from the chunk; keys/values [sink (re-rotated), history, chunk] unless capturing the sink. Between
    to_heads and to_tokens everything is on this rank's heads of every chunk token."""
    window, mode, shards = attend.window, attend.mode, attend.shards
    heads = attn.heads // shards.size
    q, k, v = shards.to_heads((attn.norm_q(attn.to_q(h)), attn.norm_k(attn.to_k(h)), attn.to_v(h)), attn.heads,
                              attend.length)
    if mode is WindowMode.CAPTURE_SINK:
        window.captured.append((k.detach().clone(), v.detach().clone()))
    q, k = apply_rope(q, attend.rope, attn.rope_layout), apply_rope(k, attend.rope, attn.rope_layout)
    if mode is WindowMode.CAPTURE_HISTORY:
        window.captured.append((k.detach().clone(), v.detach().clone()))
    if mode is not WindowMode.CAPTURE_SINK:
        keys, values = [], []
        sink_k, sink_v, history_k, history_v = layer
        if sink_k is not None and sink_v is not None:
            if attend.sink_rope is None:
                raise RuntimeError("the refiner window has a sink but no sink rotary tables")
            keys.append(apply_rope(sink_k.to(k.dtype), attend.sink_rope, attn.rope_layout))
            values.append(sink_v.to(v.dtype))
        if history_k is not None and history_v is not None:
            keys.append(history_k.to(k.dtype))
            values.append(history_v.to(v.dtype))
        if keys:
            k, v = torch.cat([*keys, k], dim=1), torch.cat([*values, v], dim=1)
    split = lambda t: t.unflatten(2, (heads, -1))  # noqa: E731
    out = shards.to_tokens(attn.attention_fn(split(q), split(k), split(v), None), h.shape[1])
    out = out.flatten(2, 3).to(q.dtype)
    if attn.gate is not None:
        gates = 2.0 * torch.sigmoid(attn.gate(h))
        out = (out.unflatten(2, (attn.heads, -1)) * gates.unsqueeze(-1)).flatten(2, 3)
    return attn.out(out)
