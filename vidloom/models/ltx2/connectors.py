"""LTX-2 text connectors: Gemma3's stacked hidden states -> the video and audio streams' text embeddings.

LTX-2.0 normalises every layer by its masked mean and range and projects the stack once; LTX-2.3
RMS-normalises per token and projects per stream. Each stream then runs a small 1D transformer
(rotary token positions; padded positions optionally replaced by learned registers). Loads diffusers'
`LTX2TextConnectors` (pipelines/ltx2/connectors.py) through LTX2_CONNECTORS_NAME_MAP; the arithmetic
follows it step by step for parity, the modules are ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn, attention
from vidloom.loading.key_policy import KeyPolicy
from vidloom.loading.name_map import NameMap
from vidloom.models.ltx2.layers import Attention, FeedForward, rms_norm
from vidloom.models.ltx2.rope import RopeSpec, text_rope_tables

# The connectors' binarisation of their additive mask (diffusers' attn_mask_binarize_threshold).
MASK_THRESHOLD = -9000.0


@dataclass(frozen=True)
class LTX2ConnectorsConfig:
    """diffusers LTX2TextConnectors config.json keys."""

    caption_channels: int = 3840
    text_proj_in_factor: int = 49  # text encoder layers + 1 (the embeddings)
    video_connector_num_attention_heads: int = 30
    video_connector_attention_head_dim: int = 128
    video_connector_num_layers: int = 2
    video_connector_num_learnable_registers: int | None = 128
    video_gated_attn: bool = False
    audio_connector_num_attention_heads: int = 30
    audio_connector_attention_head_dim: int = 128
    audio_connector_num_layers: int = 2
    audio_connector_num_learnable_registers: int | None = 128
    audio_gated_attn: bool = False
    connector_rope_base_seq_len: int = 4096
    rope_theta: float = 10000.0
    rope_double_precision: bool = True
    rope_type: str = "interleaved"
    per_modality_projections: bool = False
    video_hidden_dim: int = 4096
    audio_hidden_dim: int = 2048
    proj_bias: bool = False

    @classmethod
    def config_keys(cls) -> frozenset[str]:
        """Every config.json key from_diffusers classifies (CONNECTORS_POLICY); any other is refused."""
        return CONNECTORS_POLICY.known

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any], where: str = "connectors/config.json") -> LTX2ConnectorsConfig:
        """Read an `LTX2TextConnectors` config.json; an unknown key or a refused value is a CheckpointError."""
        CONNECTORS_POLICY.check(cfg, where)
        known = CONNECTORS_POLICY.read
        config = cls(**{k: v for k, v in cfg.items() if k in known})
        RopeSpec(1, 1, 1.0, True, config.rope_type)
        return config


# LTX2TextConnectors has had these __init__ keys since LTX-2's first diffusers release (2026-01); the converter
# writes exactly them.
CONNECTORS_POLICY = KeyPolicy(frozenset(f.name for f in fields(LTX2ConnectorsConfig)), harmless={
    "causal_temporal_positioning": "diffusers stores it on the connectors' rotary embedding, but no forward reads "
                                   "it (the positions are the same either way)",
})


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, gated: bool, layout: str, fn: AttentionFn) -> None:
        super().__init__()
        self.attn = Attention(dim, heads, head_dim, gated=gated, rope_layout=layout, attention_fn=fn)
        self.ff = FeedForward(dim)

    def forward(self, x: Tensor, mask: Tensor | None, rope: tuple[Tensor, Tensor]) -> Tensor:
        x = x + self.attn(rms_norm(x, 1e-6), mask=mask, q_rope=rope)
        return x + self.ff(rms_norm(x, 1e-6))


class TextConnector(nn.Module):
    """A 1D transformer over one stream's projected text tokens."""

    def __init__(self, c: LTX2ConnectorsConfig, stream: str, fn: AttentionFn) -> None:
        super().__init__()
        heads = getattr(c, f"{stream}_connector_num_attention_heads")
        head_dim = getattr(c, f"{stream}_connector_attention_head_dim")
        self.dim = heads * head_dim
        self.base_length = c.connector_rope_base_seq_len
        self.rope = RopeSpec(self.dim, heads, c.rope_theta, c.rope_double_precision, c.rope_type)
        registers = getattr(c, f"{stream}_connector_num_learnable_registers")
        self.registers = nn.Parameter(torch.zeros(registers, self.dim)) if registers else None
        gated = getattr(c, f"{stream}_gated_attn")
        self.blocks = nn.ModuleList(
            _Block(self.dim, heads, head_dim, gated, c.rope_type, fn)
            for _ in range(getattr(c, f"{stream}_connector_num_layers"))
        )

    def forward(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, L, D], additive mask [B, 1, 1, L] -> (tokens, the mask the blocks used)."""
        batch, length, _ = x.shape
        if self.registers is not None:
            x, mask = self._with_registers(x, mask)
        rope = text_rope_tables(batch, length, self.base_length, self.rope, x.device)
        for block in self.blocks:
            x = block(x, mask, rope)
        return rms_norm(x, 1e-6), mask

    def _with_registers(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        # Valid tokens move to the front in order; the tail takes the registers tiled by absolute
        # position; then every position attends everywhere (the reference zeroes the mask).
        batch, length, width = x.shape
        count = self.registers.shape[0]
        if length % count:
            raise ValueError(f"text length {length} is not a multiple of the {count} learnable registers")
        tiled = self.registers.unsqueeze(0).expand(length // count, -1, -1).reshape(length, -1)
        keep = (mask >= MASK_THRESHOLD).int().reshape(batch, length)
        order = torch.argsort(1 - keep, dim=1, stable=True)
        front = torch.gather(x, 1, order.unsqueeze(-1).expand(-1, -1, width))
        valid = keep.sum(dim=1, keepdim=True)
        in_front = (torch.arange(length, device=x.device).unsqueeze(0) < valid).unsqueeze(-1)
        x = torch.where(in_front, front, tiled.unsqueeze(0).expand(batch, -1, -1).to(x.dtype))
        return x, torch.zeros_like(mask)


class LTX2TextConnectors(nn.Module):
    """Stacked text-encoder states [B, L, hidden, layers] + mask [B, L] -> (video text, audio text, mask)."""

    def __init__(self, config: LTX2ConnectorsConfig, attention_fn: AttentionFn = attention) -> None:
        super().__init__()
        c = self.config = config
        width = c.caption_channels * c.text_proj_in_factor
        if c.per_modality_projections:
            self.video_proj = nn.Linear(width, c.video_hidden_dim, bias=c.proj_bias)
            self.audio_proj = nn.Linear(width, c.audio_hidden_dim, bias=c.proj_bias)
        else:
            self.proj = nn.Linear(width, c.caption_channels, bias=c.proj_bias)
        self.video = TextConnector(c, "video", attention_fn)
        self.audio = TextConnector(c, "audio", attention_fn)

    def forward(self, hidden: Tensor, mask: Tensor, padding_side: str = "left", scale: int = 8) -> tuple[Tensor, ...]:
        c = self.config
        if hidden.ndim == 3:
            hidden = hidden.unflatten(2, (c.caption_channels, -1))
        if c.per_modality_projections:  # LTX-2.3
            normed = (hidden * torch.rsqrt(torch.mean(hidden**2, dim=2, keepdim=True) + 1e-6)).flatten(2, 3)
            normed = torch.where(mask.bool().unsqueeze(-1), normed, torch.zeros_like(normed))
            video = self.video_proj(normed * math.sqrt(c.video_hidden_dim / c.caption_channels))
            audio = self.audio_proj(normed * math.sqrt(c.audio_hidden_dim / c.caption_channels))
        else:  # LTX-2.0
            video = audio = self.proj(masked_range_norm(hidden, mask.sum(dim=-1), padding_side, scale))
        dtype = video.dtype
        additive = (mask.to(torch.int64) - 1).to(dtype).reshape(mask.shape[0], 1, -1, mask.shape[-1])
        additive = additive * torch.finfo(dtype).max
        video_text, video_mask = self.video(video, additive)
        keep = (video_mask < 1e-6).to(torch.int64).reshape(video_text.shape[0], video_text.shape[1], 1)
        audio_text, _ = self.audio(audio, additive)
        return video_text * keep, audio_text, keep.squeeze(-1)


def masked_range_norm(hidden: Tensor, lengths: Tensor, padding_side: str, scale: int, eps: float = 1e-6) -> Tensor:
    """Per sample and layer: (x - masked mean) / (masked max - masked min) * scale, padding zeroed;
    [B, L, D, layers] -> [B, L, D * layers] (diffusers' per_layer_masked_mean_norm)."""
    batch, length, width, layers = hidden.shape
    positions = torch.arange(length, device=hidden.device).unsqueeze(0)
    if padding_side == "right":
        keep = positions < lengths[:, None]
    elif padding_side == "left":
        keep = positions >= length - lengths[:, None]
    else:
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    keep = keep[:, :, None, None]
    count = (lengths * width).view(batch, 1, 1, 1)
    mean = hidden.masked_fill(~keep, 0.0).sum(dim=(1, 2), keepdim=True) / (count + eps)
    low = hidden.masked_fill(~keep, float("inf")).amin(dim=(1, 2), keepdim=True)
    high = hidden.masked_fill(~keep, float("-inf")).amax(dim=(1, 2), keepdim=True)
    out = ((hidden - mean) / (high - low + eps) * scale).flatten(2)
    return out.masked_fill(~keep.squeeze(-1).expand(-1, -1, width * layers), 0.0).to(hidden.dtype)


def _stream_rules(stream: str) -> tuple[tuple[str, str], ...]:
    block = f"{stream}_connector.transformer_blocks.{{n}}"
    return (
        (f"{block}.attn1.to_out.0", f"{stream}.blocks.{{n}}.attn.out"),
        (f"{block}.attn1.to_gate_logits", f"{stream}.blocks.{{n}}.attn.gate"),
        (f"{block}.attn1", f"{stream}.blocks.{{n}}.attn"),
        (f"{block}.ff.net.0.proj", f"{stream}.blocks.{{n}}.ff.up"),
        (f"{block}.ff.net.2", f"{stream}.blocks.{{n}}.ff.down"),
        (f"{stream}_connector.learnable_registers", f"{stream}.registers"),
    )


LTX2_CONNECTORS_NAME_MAP = NameMap((
    ("text_proj_in", "proj"),
    ("video_text_proj_in", "video_proj"),
    ("audio_text_proj_in", "audio_proj"),
    *_stream_rules("video"),
    *_stream_rules("audio"),
))
