"""SANA-WM's stage-2 refiner network: an LTX-2 DiT run video-only over a sink + sliding-window KV.

The refiner checkpoint (diffusers `SanaWMLTX2RefinerTransformer3DModel`) has LTX-2's exact parameter
layout, so it loads into our `LTX2Transformer`; only the forward differs, and it lives here: the video
stream alone (self-attention -> text cross-attention -> feed-forward, no audio, no audio<->video), with
self-attention whose queries are the active chunk and whose keys/values are `[sink, history, chunk]`.
The sink K/V are kept before rotary (each window re-rotates them at a sliding offset so they sit right
before the history); history K/V are kept after rotary. The order of operations follows diffusers'
`SanaWMLTX2RefinerAttnProcessor` and block forward step by step (parity needs the same rounding); the
window bookkeeping (`RefinerWindow`) is ours and is held per request by the runtime's cache manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch
from torch import Tensor

from vidloom.models.ltx2.blocks import JointBlock
from vidloom.models.ltx2.layers import Attention, modulation
from vidloom.models.ltx2.rope import RopeTables, apply_rope, rope_tables, video_positions
from vidloom.models.ltx2.transformer import LTX2Transformer, LTX2TransformerConfig


class WindowMode(Enum):
    """What one refiner forward does with the window."""

    ATTEND = "attend"  # a denoise step: attend to [sink, history, chunk]
    CAPTURE_SINK = "capture_sink"  # the clean sink frames alone: keep their pre-rotary K/V as the sink
    CAPTURE_HISTORY = "capture_history"  # a refined chunk at sigma 0: attend, keep its post-rotary K/V


@dataclass
class LayerKV:
    """One block's window: sink K/V (pre-rotary) and the recent history K/V (post-rotary), [B, N, inner]."""

    sink_k: Tensor | None = None
    sink_v: Tensor | None = None
    history_k: Tensor | None = None
    history_v: Tensor | None = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.sink_k, self.sink_v, self.history_k, self.history_v)
                   if t is not None)


@dataclass
class RefinerWindow:
    """The sliding KV window of one refiner rollout: per-layer K/V plus the sink's rotary tables for the
    current chunk. `history_frames` counts the latent frames the history holds."""

    layers: list[LayerKV]
    tokens_per_frame: int
    sink_rope: RopeTables | None = None
    history_frames: int = 0
    captured: list[tuple[Tensor, Tensor]] = field(default_factory=list)

    @classmethod
    def empty(cls, num_layers: int, tokens_per_frame: int) -> RefinerWindow:
        return cls([LayerKV() for _ in range(num_layers)], tokens_per_frame)

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)

    def store_sink(self) -> None:
        """The last CAPTURE_SINK forward's K/V become the sink."""
        for layer, (k, v) in zip(self.layers, self._take()):
            layer.sink_k, layer.sink_v = k, v

    def append_history(self, frames: int, max_frames: int) -> None:
        """The last CAPTURE_HISTORY forward's K/V join the history, trimmed to the newest `max_frames`
        frames (no trim when `max_frames` <= 0, as the reference)."""
        self.history_frames += frames
        keep = max_frames * self.tokens_per_frame if 0 < max_frames < self.history_frames else None
        for layer, (k, v) in zip(self.layers, self._take()):
            if layer.history_k is not None:
                k, v = torch.cat([layer.history_k, k], dim=1), torch.cat([layer.history_v, v], dim=1)
            layer.history_k, layer.history_v = (k[:, -keep:], v[:, -keep:]) if keep else (k, v)
        if keep:
            self.history_frames = max_frames

    def clear(self) -> None:
        self.layers = [LayerKV() for _ in self.layers]
        self.sink_rope, self.history_frames, self.captured = None, 0, []

    def _take(self) -> list[tuple[Tensor, Tensor]]:
        if len(self.captured) != len(self.layers):
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
                     timestep: Tensor, rope: RopeTables, window: RefinerWindow, mode: WindowMode) -> Tensor:
    """Velocity [B, N, C] of the chunk's packed tokens [B, N, C] at timestep [B] (sigma x multiplier).
    text: the connectors' video output [B, L, caption width]; text_mask [B, L], 1 = attend."""
    batch = tokens.shape[0]
    # 1. Timestep modulation (one sigma for every token of the chunk) and the projected prompt.
    mod, embedded = dit.video_time(timestep, batch, tokens.dtype)
    text = dit.video_caption(text).view(batch, -1, dit.config.dim)
    mask = None if text_mask is None else ((1 - text_mask.to(tokens.dtype)) * -10000.0)[:, None, None, :]
    # 2. Video-only blocks over the window.
    x = dit.video_in(tokens)
    window.captured = []
    for block, layer in zip(dit.blocks, window.layers):
        x = _block(block, x, text, mask, mod, rope, layer, window, mode)
    # 3. Output modulation and projection.
    return dit._out(x, embedded, dit.video_out_table, dit.video_out)


def _block(block: JointBlock, x: Tensor, text: Tensor, mask: Tensor | None, mod: Tensor, rope: RopeTables,
           layer: LayerKV, window: RefinerWindow, mode: WindowMode) -> Tensor:
    p = modulation(block.video_table, mod, x.shape[0])
    h = block.video_norm_self(x) * (1 + p[1]) + p[0]
    x = x + _window_attention(block.video_self, h, rope, layer, window, mode) * p[2]
    x = x + block.video_text(block.video_norm_text(x), text, mask)
    return x + block.video_ff(block.video_norm_ff(x) * (1 + p[4]) + p[3]) * p[5]


def _window_attention(attn: Attention, h: Tensor, rope: RopeTables, layer: LayerKV, window: RefinerWindow,
                      mode: WindowMode) -> Tensor:
    """Queries from the chunk; keys/values [sink (re-rotated), history, chunk] unless capturing the sink."""
    q, k, v = attn.norm_q(attn.to_q(h)), attn.norm_k(attn.to_k(h)), attn.to_v(h)
    if mode is WindowMode.CAPTURE_SINK:
        window.captured.append((k.detach().clone(), v.detach().clone()))
    q, k = apply_rope(q, rope, attn.rope_layout), apply_rope(k, rope, attn.rope_layout)
    if mode is WindowMode.CAPTURE_HISTORY:
        window.captured.append((k.detach().clone(), v.detach().clone()))
    if mode is not WindowMode.CAPTURE_SINK:
        keys, values = [], []
        if layer.sink_k is not None and layer.sink_k.shape[1] > 0:
            if window.sink_rope is None:
                raise RuntimeError("the refiner window has a sink but no sink rotary tables")
            keys.append(apply_rope(layer.sink_k.to(k.dtype), window.sink_rope, attn.rope_layout))
            values.append(layer.sink_v.to(v.dtype))
        if layer.history_k is not None and layer.history_k.shape[1] > 0:
            keys.append(layer.history_k.to(k.dtype))
            values.append(layer.history_v.to(v.dtype))
        if keys:
            k, v = torch.cat([*keys, k], dim=1), torch.cat([*values, v], dim=1)
    split = lambda t: t.unflatten(2, (attn.heads, -1))  # noqa: E731
    out = attn.attention_fn(split(q), split(k), split(v), None).flatten(2, 3).to(q.dtype)
    if attn.gate is not None:
        gates = 2.0 * torch.sigmoid(attn.gate(h))
        out = (out.unflatten(2, (attn.heads, -1)) * gates.unsqueeze(-1)).flatten(2, 3)
    return attn.out(out)
