"""Stable Audio Open's DiT: audio latents [B, C, T] -> v-prediction [B, C, T], one global token prepended.

Layout (diffusers `StableAudioDiTModel`): the noise level (already preconditioned to atan(sigma) * 2 / pi) goes
through random Fourier features and an MLP and is added to the projected duration embedding, which becomes the
first token of the sequence; latents pass a residual 1x1 conv and a linear in; each block is self-attention with
partial rotary embeddings (the first half of each head), cross-attention to the projected text (grouped K/V
heads) and a SwiGLU MLP, each pre-LayerNorm with a residual; a linear out drops the global token and a residual
1x1 conv finishes. Loaded from the diffusers layout through STABLE_AUDIO_DIT_NAME_MAP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn, attention
from vidloom.layers.block_stack import BlockStack
from vidloom.layers.prompt_kv import PromptKV, prepare_prompt_kv
from vidloom.layers.sequence import WHOLE_SEQUENCE, SequenceLayout
from vidloom.loading.config_keys import check_class_name, positive_int, read_key
from vidloom.loading.key_policy import KeyPolicy
from vidloom.loading.name_map import NameMap

DIFFUSERS_CLASS_NAME = "StableAudioDiTModel"
NORM_EPS = 1e-5  # StableAudioDiTBlock's LayerNorm eps
ROPE_THETA = 10000.0  # get_1d_rotary_pos_embed's default, which the pipeline uses
FF_MULT = 4  # diffusers FeedForward's default width multiple (the block passes no inner dim)

STABLE_AUDIO_DIT_NAME_MAP = NameMap((
    ("time_proj.weight", "time_freqs"),
    ("transformer_blocks.{n}.attn1.to_out.0", "blocks.{n}.attn1.to_out"),
    ("transformer_blocks.{n}.attn2.to_out.0", "blocks.{n}.attn2.to_out"),
    ("transformer_blocks.{n}.ff.net.0.proj", "blocks.{n}.ff_in"),
    ("transformer_blocks.{n}.ff.net.2", "blocks.{n}.ff_out"),
    ("transformer_blocks.{n}", "blocks.{n}"),
))


@dataclass(frozen=True)
class StableAudioDiTConfig:
    """The DiT's sizes, from transformer/config.json (every StableAudioDiTModel argument is read)."""

    sample_size: int = 1024  # latent steps of the model's full window (output length is cut from it)
    in_channels: int = 64
    num_layers: int = 24
    head_dim: int = 64
    num_heads: int = 24
    num_kv_heads: int = 12  # cross-attention K/V heads
    out_channels: int = 64
    cross_attention_dim: int = 768
    time_proj_dim: int = 256
    global_states_input_dim: int = 1536
    cross_attention_input_dim: int = 768

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        """Channels of each head that rotate (the pipeline's rotary_embed_dim: half the head)."""
        return self.head_dim // 2

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> StableAudioDiTConfig:
        where = "transformer/config.json"
        check_class_name(cfg, (DIFFUSERS_CLASS_NAME,), where)
        keys = {"sample_size": "sample_size", "in_channels": "in_channels", "num_layers": "num_layers",
                "attention_head_dim": "head_dim", "num_attention_heads": "num_heads",
                "num_key_value_attention_heads": "num_kv_heads", "out_channels": "out_channels",
                "cross_attention_dim": "cross_attention_dim", "time_proj_dim": "time_proj_dim",
                "global_states_input_dim": "global_states_input_dim",
                "cross_attention_input_dim": "cross_attention_input_dim"}
        KeyPolicy(frozenset(keys)).check(cfg, where)
        defaults = cls()
        values = {ours: read_key(cfg, theirs, getattr(defaults, ours), positive_int, where)
                  for theirs, ours in keys.items()}
        config = cls(**values)
        if config.num_heads % config.num_kv_heads or config.head_dim % 4 or config.time_proj_dim % 2:
            raise ValueError(f"{where}: heads must divide by K/V heads, head dim by 4 and time_proj_dim by 2")
        return config


def rotary_tables(length: int, rotary_dim: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos, sin [length, rotary_dim] (float32): each half of the rotated channels shares the frequencies
    1 / theta^(2i / rotary_dim) (diffusers get_1d_rotary_pos_embed, use_real, halves not interleaved)."""
    freqs = 1.0 / (ROPE_THETA ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))
    angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), freqs)
    return torch.cat([angles.cos(), angles.cos()], dim=-1), torch.cat([angles.sin(), angles.sin()], dim=-1)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding on the first cos.shape[-1] channels of x [B, S, H, D] (float32 math, x's dtype out)."""
    rot = cos.shape[-1]
    head, tail = x[..., :rot].float(), x[..., rot:]
    first, second = head.chunk(2, dim=-1)
    turned = torch.cat([-second, first], dim=-1)
    rotated = head * cos[:, None] + turned * sin[:, None]
    return torch.cat([rotated.to(x.dtype), tail], dim=-1)


class Attention(nn.Module):
    """Multi-head attention; K/V heads fewer than query heads are repeated (grouped-query)."""

    def __init__(self, dim: int, kv_in: int, heads: int, kv_heads: int, head_dim: int, attention_fn: AttentionFn):
        super().__init__()
        self.num_heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.to_q = nn.Linear(dim, heads * head_dim, bias=False)
        self.to_k = nn.Linear(kv_in, kv_heads * head_dim, bias=False)
        self.to_v = nn.Linear(kv_in, kv_heads * head_dim, bias=False)
        self.to_out = nn.Linear(heads * head_dim, dim, bias=False)
        self.attention_fn = attention_fn

    def context_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values [B, L, kv_heads, Dh] of context tokens [B, L, kv_in]: what forward's `context` takes
        instead, so a context that does not change between calls (a request's prompt) is projected once."""
        b = context.shape[0]
        return (self.to_k(context).view(b, -1, self.kv_heads, self.head_dim),
                self.to_v(context).view(b, -1, self.kv_heads, self.head_dim))

    def forward(self, x: Tensor, context: Tensor | tuple[Tensor, Tensor], rope: tuple[Tensor, Tensor] | None = None,
                key_mask: Tensor | None = None) -> Tensor:
        """context: tokens, or their context_kv(...) computed earlier. key_mask: a padded shard's
        (layers.sequence.JointPart), None unpadded."""
        b = x.shape[0]
        q = self.to_q(x).view(b, -1, self.num_heads, self.head_dim)
        k, v = context if isinstance(context, tuple) else self.context_kv(context)
        if self.kv_heads != self.num_heads:
            k = k.repeat_interleave(self.num_heads // self.kv_heads, dim=2)
            v = v.repeat_interleave(self.num_heads // self.kv_heads, dim=2)
        if rope is not None:  # self-attention only: queries and keys share positions
            q, k = rotate(q, *rope), rotate(k, *rope)
        out = self.attention_fn(q, k, v) if key_mask is None else self.attention_fn(q, k, v, key_mask)
        return self.to_out(out.reshape(b, -1, self.num_heads * self.head_dim))


class DiTBlock(nn.Module):
    def __init__(self, config: StableAudioDiTConfig, attention_fn: AttentionFn) -> None:
        super().__init__()
        dim, inner = config.dim, FF_MULT * config.dim
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn1 = Attention(dim, dim, config.num_heads, config.num_heads, config.head_dim, attention_fn)
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn2 = Attention(dim, config.cross_attention_dim, config.num_heads, config.num_kv_heads,
                               config.head_dim, attention_fn)
        self.norm3 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.ff_in = nn.Linear(dim, 2 * inner)
        self.ff_out = nn.Linear(inner, dim)

    def forward(self, x: Tensor, context: Tensor | tuple[Tensor, Tensor], rope: tuple[Tensor, Tensor],
                key_mask: Tensor | None = None) -> Tensor:
        """context: the projected text [B, L, cross_attention_dim], or attn2's keys/values of it."""
        h = self.norm1(x)
        x = self.attn1(h, h, rope, key_mask) + x
        x = self.attn2(self.norm2(x), context) + x
        value, gate = self.ff_in(self.norm3(x)).chunk(2, dim=-1)
        return self.ff_out(value * F.silu(gate)) + x


@dataclass(frozen=True)
class StableAudioConditioning:
    """What every block reads for one call (StableAudioDiT.embed builds it)."""

    context: Tensor | PromptKV  # projected text tokens [B, L, cross_attention_dim], or every block's K/V of them
    rope: tuple[Tensor, Tensor]  # self-attention rotary cos, sin [1 + T, rotary_dim] (this rank's rows under sp)
    length: int = 0  # tokens 1 + T before any padding sequence parallel added
    key_mask: Tensor | None = None  # the padded stream's key mask (layers.sequence.JointPart), None unpadded


def _mlp(d_in: int, d_out: int, bias: bool) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d_out, bias=bias), nn.SiLU(), nn.Linear(d_out, d_out, bias=bias))


class StableAudioDiT(BlockStack, nn.Module):
    def __init__(self, config: StableAudioDiTConfig, attention_fn: AttentionFn = attention) -> None:
        super().__init__()
        self.config = config
        dim = config.dim
        self.time_freqs = nn.Parameter(torch.zeros(config.time_proj_dim // 2), requires_grad=False)
        self.timestep_proj = _mlp(config.time_proj_dim, dim, bias=True)
        self.global_proj = _mlp(config.global_states_input_dim, dim, bias=False)
        self.cross_attention_proj = nn.Sequential(
            nn.Linear(config.cross_attention_input_dim, config.cross_attention_dim, bias=False), nn.SiLU(),
            nn.Linear(config.cross_attention_dim, config.cross_attention_dim, bias=False))
        self.preprocess_conv = nn.Conv1d(config.in_channels, config.in_channels, 1, bias=False)
        self.proj_in = nn.Linear(config.in_channels, dim, bias=False)
        self.blocks = nn.ModuleList(DiTBlock(config, attention_fn) for _ in range(config.num_layers))
        self.proj_out = nn.Linear(dim, config.out_channels, bias=False)
        self.postprocess_conv = nn.Conv1d(config.out_channels, config.out_channels, 1, bias=False)

    # Which rows of [global token, latent tokens] this device holds: all of them, unless sequence parallel
    # swapped in a sharded layout (runtime.parallel.ulysses.apply_sp).
    sequence: SequenceLayout = WHOLE_SEQUENCE

    def self_attentions(self) -> Iterator[Attention]:
        """Each block's self-attention (sequence parallel wraps it); cross-attention reads the whole text."""
        for block in self.blocks:
            yield block.attn1

    def time_embedding(self, timestep: Tensor) -> Tensor:
        """[N] preconditioned noise levels -> [N, dim]: cos | sin of 2 pi t w, then the MLP."""
        t = timestep.to(self.time_freqs.dtype)
        angles = 2 * math.pi * t[:, None] @ self.time_freqs[None, :]
        return self.timestep_proj(torch.cat([angles.cos(), angles.sin()], dim=-1))

    def forward(self, latents: Tensor, timestep: Tensor, text: Tensor, global_states: Tensor) -> Tensor:
        """latents [B, C, T], timestep [1] or [B], text [B, L, cross_attention_input_dim],
        global_states [B, 1, global_states_input_dim] -> [B, out_channels, T]."""
        stream, cond = self.embed(latents, timestep, text, global_states)
        return self.head(self.run_blocks(stream, cond), cond)

    # The stages below are the denoiser contract (core.denoiser.StagedDenoiser); forward() is exactly their
    # composition. The residual stream is the token sequence [B, 1 + T, dim] (the global token first).

    def prepare_prompt(self, text: Tensor) -> PromptKV:
        """Every block's cross-attention keys/values of text [B, L, cross_attention_input_dim]
        (core.denoiser.PreparesPrompt): what embed's `text` takes instead."""
        return prepare_prompt_kv([block.attn2 for block in self.blocks], self.cross_attention_proj, text)

    def embed(self, latents: Tensor, timestep: Tensor, text: Tensor | PromptKV,
              global_states: Tensor) -> tuple[Tensor, StableAudioConditioning]:
        """Inputs (as forward; `text` may be prepare_prompt(text)) -> the token stream and what every block and the
        head read."""
        # 1. Conditioning: text for cross-attention (prepared: already keys/values); duration + noise level as one
        # leading token.
        context = text if isinstance(text, PromptKV) else self.cross_attention_proj(text)
        glob = self.global_proj(global_states) + self.time_embedding(timestep).unsqueeze(1)  # [B, 1, dim]
        # 2. Latents to tokens, behind the global token.
        x = self.preprocess_conv(latents) + latents
        x = torch.cat([glob, self.proj_in(x.transpose(1, 2))], dim=1)  # [B, 1 + T, dim]
        rope = rotary_tables(x.shape[1], self.config.rotary_dim, x.device)
        part = self.sequence.shard_joint(x, rope, 0)
        return part.tokens, StableAudioConditioning(context, part.tables, part.length, part.key_mask)

    def run_blocks(self, x: Tensor, cond: StableAudioConditioning, start: int = 0, end: int | None = None) -> Tensor:
        """Blocks [start, end) over the token stream."""
        # 3. Blocks.
        context = cond.context
        for index in range(start, self.num_blocks if end is None else end):
            text = context.block(index) if isinstance(context, PromptKV) else context
            x = self.blocks[index](x, text, cond.rope, cond.key_mask)
        return x

    def block_input(self, x: Tensor, cond: StableAudioConditioning, index: int = 0) -> Tensor:
        """The normed tokens block `index` feeds to self-attention (TeaCache's generic indicator). The noise
        level reaches them through the global token, the DiT's only timestep conditioning."""
        return self.blocks[index].norm1(x)

    def head(self, x: Tensor, cond: StableAudioConditioning) -> Tensor:
        """Tokens after the last block -> [B, out_channels, T]."""
        # 4. Back to channels, without the global token.
        x = self.proj_out(self.sequence.gather_joint(x, cond.length)).transpose(1, 2)[:, :, 1:]
        return self.postprocess_conv(x) + x
