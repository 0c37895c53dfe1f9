"""Helios diffusion transformer, numerically matching diffusers' HeliosTransformer3DModel.

A Wan-shaped DiT that denoises one chunk while attending to compressed history: short, mid and long history
latents are patchified at 1x, 2x and 4x the chunk's patch and their tokens prepended to the chunk's, with RoPE
positions from explicit frame indices (so every chunk sees the same relative positions). History tokens are
modulated as at timestep 0, skip cross-attention, and are dropped before the output head.

Under sequence parallel (runtime.parallel.ulysses.apply_sp swaps `sequence` and wraps every block's self-attention)
the joint [history, chunk] stream is sharded right after embedding with its RoPE rows, padded at its end when it does
not split, and gathered before the head: a rank's rows are history rows, then chunk rows, and each keeps its own
modulation, key amplification and cross-attention. The text is cross-attention context, whole on every rank.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.families.helios.config import HeliosTransformerConfig
from vidloom.layers.attention import AttentionFn, attention
from vidloom.layers.block_stack import BlockStack
from vidloom.layers.fp8 import project
from vidloom.layers.prompt_kv import PADDING_KEY_MULTIPLE, PromptKV, prepare_prompt_kv
from vidloom.layers.sequence import WHOLE_SEQUENCE, SequenceLayout
from vidloom.layers.timestep import timestep_features
from vidloom.models.wan.ops import apply_rope, gated_residual, modulate
from vidloom.models.wan.transformer import MLP, WanAttention

MAX_HISTORY_KEY_SCALE = 10.0  # HeliosAttention.max_scale: amplified history keys scale by 1 + sigmoid(s) * 9
# The reference pads history latents (and their RoPE grids) to these multiples before the 2x / 4x patch.
MID_LATENT_PAD, LONG_LATENT_PAD = (2, 4, 4), (4, 8, 8)
MID_POOL, LONG_POOL = 2, 4


@dataclass(frozen=True)
class HeliosHistory:
    """One chunk's history: latents [B, C, T_k, H, W] per term with their latent frame indices [T_k]."""

    short: Tensor
    short_indices: Tensor
    mid: Tensor | None = None
    mid_indices: Tensor | None = None
    long: Tensor | None = None
    long_indices: Tensor | None = None


# ---------------------------------------------------------------------------
# RoPE from frame indices
# ---------------------------------------------------------------------------


def _inverse_frequencies(dim: int, theta: float, device: torch.device) -> Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device)[: dim // 2] / dim))


def rope_grid(frames: Tensor, height: int, width: int, config: HeliosTransformerConfig) -> Tensor:
    """(cos, sin) pairs [T, H, W, Dh/2, 2] in float32 for latent frame indices `frames` [T] over an H x W grid.

    Channel pairs go to (frame, row, column) by rope_dim, angles are float32 products (not float64, unlike
    Wan): the reference's HeliosRotaryPosEmbed arithmetic, followed step by step for parity."""
    device = frames.device
    d_t, d_y, d_x = config.rope_dim
    t = frames.float()[:, None] * _inverse_frequencies(d_t, config.rope_theta, device)
    y = torch.arange(height, dtype=torch.float32, device=device)[:, None] * _inverse_frequencies(
        d_y, config.rope_theta, device)
    x = torch.arange(width, dtype=torch.float32, device=device)[:, None] * _inverse_frequencies(
        d_x, config.rope_theta, device)
    grid = (len(frames), height, width)
    angles = torch.cat([
        t[:, None, None, :].expand(*grid, -1),
        y[None, :, None, :].expand(*grid, -1),
        x[None, None, :, :].expand(*grid, -1),
    ], dim=-1)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def pooled_rope_grid(table: Tensor, factor: int) -> Tensor:
    """A rope grid [T, H, W, P, 2] edge-padded to multiples of `factor` and averaged over factor^3 cells: the
    reference averages the cos/sin values themselves (not the angles) for the 2x and 4x history patches."""
    channels_first = table.flatten(3).permute(3, 0, 1, 2)[None]  # [1, P*2, T, H, W]
    pooled = F.avg_pool3d(_pad_to_multiple(channels_first, (factor,) * 3), factor, stride=factor)[0]
    return pooled.permute(1, 2, 3, 0).unflatten(-1, table.shape[-2:])


def patch_tokens(conv: nn.Conv3d, x: Tensor) -> tuple[Tensor, tuple[int, int, int]]:
    """`conv(x).flatten(2).transpose(1, 2)` for a patch embedding (stride = kernel, no padding) on x [B, C, T, H, W],
    and its patch grid: the patches gathered into rows and one matmul against the
    flattened kernel. Same products and sums; the conv ran the 4x history kernel (4 x 8 x 8) on oneDNN at about 6 ms
    for 16 tokens, 3% of a helios-mid forward (bench/helios_parts.py --profile), the matmul well under 1 ms."""
    (k_t, k_h, k_w), (b, c, t, h, w) = conv.kernel_size, x.shape
    grid = (t // k_t, h // k_h, w // k_w)
    x = x[:, :, :grid[0] * k_t, :grid[1] * k_h, :grid[2] * k_w]  # a remainder the strided conv would not reach
    rows = x.reshape(b, c, grid[0], k_t, grid[1], k_h, grid[2], k_w).permute(0, 2, 4, 6, 1, 3, 5, 7)
    return F.linear(rows.reshape(b, math.prod(grid), -1), conv.weight.flatten(1), conv.bias), grid


def _pad_to_multiple(x: Tensor, multiple: tuple[int, int, int]) -> Tensor:
    """[B, C, T, H, W] edge-padded at the end of each of T, H, W to a multiple of `multiple`."""
    pads = [(-size) % m for size, m in zip(x.shape[2:], multiple)]
    return F.pad(x, (0, pads[2], 0, pads[1], 0, pads[0]), mode="replicate")


# ---------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------


def _split(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    return x[:, :n], x[:, n:]


def modulate_segments(x: Tensor, n: int, history: tuple[Tensor, Tensor], current: tuple[Tensor, Tensor],
                      eps: float) -> Tensor:
    """AdaLN with one (shift, scale) for the first n (history) tokens and another for the rest."""
    if n == 0:
        return modulate(x, *current, eps)
    past, now = _split(x, n)
    return torch.cat([modulate(past, *history, eps), modulate(now, *current, eps)], dim=1)


def residual_segments(x: Tensor, update: Tensor, n: int, history_gate: Tensor, gate: Tensor) -> Tensor:
    """x + update * gate, the first n tokens gated by history_gate."""
    if n == 0:
        return gated_residual(x, update, gate)
    (past, now), (past_update, now_update) = _split(x, n), _split(update, n)
    return torch.cat([gated_residual(past, past_update, history_gate), gated_residual(now, now_update, gate)], 1)


class HeliosSelfAttention(WanAttention):
    """Wan's self-attention, optionally amplifying the history tokens' keys (after RoPE) by a learned factor."""

    def __init__(self, config: HeliosTransformerConfig, attention_fn: AttentionFn) -> None:
        super().__init__(config.inner_dim, config.num_attention_heads, config.eps, attention_fn)
        self.history_key_scale: nn.Parameter | None = None
        if config.is_amplify_history:
            width = config.num_attention_heads if config.history_scale_mode == "per_head" else 1
            self.history_key_scale = nn.Parameter(torch.ones(width))

    def attend(self, x: Tensor, rope: Tensor, num_history: int, key_mask: Tensor | None = None) -> Tensor:
        """`key_mask`: a sharded stream's pad mask (JointPart.key_mask), for the sequence-parallel wrapper."""
        q, k, v = project(x, self.q, self.k, self.v)
        q = apply_rope(self.norm_q(q).unflatten(-1, (self.num_heads, -1)), rope)  # [B, S, H, Dh]
        k = apply_rope(self.norm_k(k).unflatten(-1, (self.num_heads, -1)), rope)
        v = v.unflatten(-1, (self.num_heads, -1))
        if self.history_key_scale is not None and num_history:
            factor = 1.0 + torch.sigmoid(self.history_key_scale.float()) * (MAX_HISTORY_KEY_SCALE - 1.0)
            past, now = _split(k, num_history)
            k = torch.cat([(past * factor[:, None]).to(k.dtype), now], dim=1)  # [H, 1] or [1, 1] per head
        out = self.attention_fn(q, k, v) if key_mask is None else self.attention_fn(q, k, v, key_mask)
        return self.out(out.flatten(-2))


class HeliosBlock(nn.Module):
    """Self-attention over history + chunk -> cross-attention to text (the chunk only, by default) -> FFN."""

    def __init__(self, config: HeliosTransformerConfig, attention_fn: AttentionFn,
                 cross_attention_fn: AttentionFn | None = None) -> None:
        super().__init__()
        dim = config.inner_dim
        self.eps = config.eps
        self.guidance_cross_attn = config.guidance_cross_attn
        self.self_attn = HeliosSelfAttention(config, attention_fn)
        self.cross_norm = nn.LayerNorm(dim, eps=config.eps) if config.cross_attn_norm else None
        self.cross_attn = WanAttention(dim, config.num_attention_heads, config.eps, cross_attention_fn or attention_fn)
        self.ffn = MLP(dim, config.ffn_dim, dim, nn.GELU(approximate="tanh"))
        # Per-block offsets to the shared modulation: (shift, scale, gate) for self-attention then the FFN.
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(self, x: Tensor, cond: HeliosConditioning, text: Tensor | tuple[Tensor, Tensor],
                text_mask: Tensor | None = None) -> Tensor:
        # x: [B, S_hist + S, D], history tokens first; text: [B, L, D], or its cross-attention (keys, values)
        # text_mask: the collapsed prompt padding's key bias [B, 1, 1, L] (PromptKV.mask), or None
        n = cond.num_history
        now = (self.modulation.float() + cond.time_mod.float()).chunk(6, dim=1)  # 6 x [B, 1, D]
        past = (self.modulation.float() + cond.history_mod.float()).chunk(6, dim=1)

        # 1. Self-attention over history and chunk tokens
        h = modulate_segments(x, n, past[:2], now[:2], self.eps)
        x = residual_segments(x, self.self_attn.attend(h, cond.rope, n, cond.key_mask), n, past[2], now[2])

        # 2. Cross-attention to text, unmodulated and ungated; history tokens skip it by default
        start = n if self.guidance_cross_attn else 0
        queries = x[:, start:]
        if self.cross_norm is not None:
            weight, bias = self.cross_norm.weight.float(), self.cross_norm.bias.float()
            h = F.layer_norm(queries.float(), (queries.shape[-1],), weight, bias, self.eps).type_as(x)
        else:
            h = queries
        update = self.cross_attn(h, text, mask=text_mask)
        x = x + update if start == 0 else torch.cat([x[:, :start], queries + update], dim=1)

        # 3. Feed-forward
        h = modulate_segments(x, n, past[3:5], now[3:5], self.eps)
        return residual_segments(x, self.ffn(h), n, past[5], now[5])


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HeliosConditioning:
    """What every block of one forward call reads; built by `embed`, never kept on the module."""

    text: Tensor | PromptKV
    """Projected text tokens [B, L, D], or every block's cross-attention keys/values of them (prepare_prompt)."""
    temb: Tensor
    """The chunk's timestep embedding [B, D]; offsets the output modulation."""
    time_mod: Tensor
    """The chunk tokens' per-block modulation [B, 6, D]."""
    history_mod: Tensor
    """The history tokens' modulation [B or 1, 6, D] (timestep 0 when zero_history_timestep)."""
    rope: Tensor
    """(cos, sin) pairs [S_hist + S, Dh/2, 2] of this device's rows, history rows first."""
    num_history: int
    """History tokens ahead of the chunk's among this device's rows."""
    grid: tuple[int, int, int]
    """The chunk's patch grid (f, h, w)."""
    latent_shape: tuple[int, int, int, int, int]
    """Shape (B, C_in, F, H, W) of the chunk's latents, for unpatchify."""
    history_tokens: int
    """History tokens ahead of the chunk's in the whole stream (the head drops them)."""
    length: int
    """Rows of the whole [history, chunk] stream before a sharded layout padded it."""
    key_mask: Tensor | None = None
    """[S_padded] bool on the CPU when a sharded stream was padded to split (its pad rows are no keys); else None."""


class HistoryEmbed(nn.Module):
    """The short, mid and long history patch embeddings (1x, 2x and 4x the chunk's patch)."""

    def __init__(self, config: HeliosTransformerConfig) -> None:
        super().__init__()
        dim, patch = config.inner_dim, config.patch_size
        self.short = nn.Conv3d(config.in_channels, dim, kernel_size=patch, stride=patch)
        mid = tuple(MID_POOL * p for p in patch)
        self.mid = nn.Conv3d(config.in_channels, dim, kernel_size=mid, stride=mid)
        long = tuple(LONG_POOL * p for p in patch)
        self.long = nn.Conv3d(config.in_channels, dim, kernel_size=long, stride=long)

    def tokens(self, history: HeliosHistory, config: HeliosTransformerConfig) -> tuple[Tensor, Tensor]:
        """History tokens [B, S_hist, D] (long, mid, short: the reference's order) and their rope rows."""
        short, (_, height, width) = patch_tokens(self.short, history.short)
        tokens = [short]
        ropes = [rope_grid(history.short_indices, height, width, config).flatten(0, 2)]
        terms = ((history.mid, history.mid_indices, self.mid, MID_LATENT_PAD, MID_POOL),
                 (history.long, history.long_indices, self.long, LONG_LATENT_PAD, LONG_POOL))
        for latents, indices, conv, pad, pool in terms:
            if latents is None or indices is None:
                continue
            tokens.insert(0, patch_tokens(conv, _pad_to_multiple(latents, pad))[0])
            grid = rope_grid(indices, height, width, config)
            ropes.insert(0, pooled_rope_grid(grid, pool).flatten(0, 2))
        return torch.cat(tokens, dim=1), torch.cat(ropes, dim=0)


class HeliosTransformer(BlockStack, nn.Module):
    """Helios DiT: the flow-matching velocity of one chunk's latents, given its history, a timestep and text.

    Holds no per-call state. `forward` is exactly `embed -> run_blocks -> head`.
    """

    KEEP_FP32: ClassVar[frozenset[str]] = frozenset(
        {"time_embed", "modulation", "out_modulation", "cross_norm", "history_key_scale"})
    """Name segments of parameters kept in float32 when the rest is cast to bf16/fp16, as the reference does."""

    # Which rows of the [history, chunk] stream this device holds: all of them, unless sequence parallel swapped in
    # a sharded layout from outside (runtime.parallel.ulysses.apply_sp, with self_attentions()).
    sequence: SequenceLayout = WHOLE_SEQUENCE
    prompt_key_multiple: int | None = PADDING_KEY_MULTIPLE
    """prepare_prompt collapses the prompt's zero padding keys (layers.prompt_kv) to a multiple of this many keys;
    None keeps every key (set at load, layers.prompt_kv.padding_key_multiple)."""

    def __init__(self, config: HeliosTransformerConfig, attention_fn: AttentionFn = attention,
                 cross_attention_fn: AttentionFn | None = None) -> None:
        super().__init__()
        self.config = config
        dim = config.inner_dim
        self.patch_embed = nn.Conv3d(config.in_channels, dim, kernel_size=config.patch_size,
                                     stride=config.patch_size)
        self.history_embed = HistoryEmbed(config) if config.has_multi_term_memory_patch else None
        self.time_embed = MLP(config.freq_dim, dim, dim, nn.SiLU())
        self.time_modulation = nn.Linear(dim, 6 * dim)
        self.text_embed = MLP(config.text_dim, dim, dim, nn.GELU(approximate="tanh"))
        self.blocks = nn.ModuleList(HeliosBlock(config, attention_fn, cross_attention_fn)
                                    for _ in range(config.num_layers))
        self.out_modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)
        self.proj_out = nn.Linear(dim, config.out_channels * math.prod(config.patch_size))

    def self_attentions(self) -> Iterator[WanAttention]:
        """Every block's self-attention over the whole [history, chunk] stream (sequence parallel wraps it); the
        cross-attention to the text runs on each rank's rows as it is."""
        return (block.self_attn for block in self.blocks)

    def forward(self, latents: Tensor, timestep: Tensor, text_embeds: Tensor | PromptKV, frame_indices: Tensor,
                history: HeliosHistory | None = None) -> Tensor:
        """latents [B, C_in, F, H, W] (one chunk), timestep [B], text_embeds [B, L, text_dim], frame_indices [F]
        (the chunk's latent frame positions), history (or None) -> velocity [B, C_out, F, H, W]."""
        x, cond = self.embed(latents, timestep, text_embeds, frame_indices, history)
        return self.head(self.run_blocks(x, cond), cond)

    def _time(self, timestep: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        freq = timestep_features(timestep, self.config.freq_dim).to(self.time_embed.up.weight.dtype)
        temb = self.time_embed(freq).to(dtype)
        return temb, self.time_modulation(F.silu(temb)).unflatten(-1, (6, -1))

    def prepare_prompt(self, text_embeds: Tensor) -> PromptKV:
        """Every block's cross-attention keys/values of text_embeds [B, L, text_dim] (core.denoiser.PreparesPrompt):
        what embed's `text_embeds` takes instead, the zero padding rows collapsed (prompt_key_multiple, as Wan's)."""
        return prepare_prompt_kv([block.cross_attn for block in self.blocks], self.text_embed, text_embeds,
                                 key_multiple=self.prompt_key_multiple)

    def embed(self, latents: Tensor, timestep: Tensor, text_embeds: Tensor | PromptKV, frame_indices: Tensor,
              history: HeliosHistory | None = None) -> tuple[Tensor, HeliosConditioning]:
        """Tokens [B, S_hist + S, D] for the first block (history first; this device's rows of them), and what
        every block reads. `text_embeds`: [B, L, text_dim], or their prepare_prompt(...)."""
        cfg = self.config
        batch = latents.shape[0]
        if timestep.ndim == 0:
            timestep = timestep.expand(batch)

        # 1. Patchify the chunk: [B, C, F, H, W] -> [B, S, D], and its rope rows from the frame indices
        x, grid = patch_tokens(self.patch_embed, latents)
        rope = rope_grid(frame_indices.to(latents.device), grid[1], grid[2], cfg).flatten(0, 2)

        # 2. History tokens (long, mid, short) ahead of the chunk's
        num_history = 0
        if history is not None:
            if self.history_embed is None:
                raise ValueError("history latents given to a transformer without history patch embeddings")
            past, past_rope = self.history_embed.tokens(history, cfg)
            num_history = past.shape[1]
            x, rope = torch.cat([past, x], dim=1), torch.cat([past_rope, rope], dim=0)

        # 3. Timestep modulation: the chunk's, and the history's (timestep 0 unless configured otherwise)
        temb, time_mod = self._time(timestep, text_embeds.dtype)
        history_mod = time_mod
        if cfg.zero_history_timestep:
            history_mod = self._time(torch.zeros(1, dtype=timestep.dtype, device=timestep.device),
                                     text_embeds.dtype)[1]

        # 4. Text: [B, L, text_dim] -> [B, L, D] (prepared: already every block's keys/values)
        text = text_embeds if isinstance(text_embeds, PromptKV) else self.text_embed(text_embeds)

        # 5. This device's rows of the joint stream (all of them on one device), history rows first
        part = self.sequence.shard_joint(x, (rope,), num_history)
        cond = HeliosConditioning(text, temb, time_mod, history_mod, part.tables[0].contiguous(), part.prefix,
                                  grid, tuple(latents.shape), history_tokens=num_history,  # type: ignore[arg-type]
                                  length=part.length, key_mask=part.key_mask)
        return part.tokens.contiguous(), cond

    def run_blocks(self, x: Tensor, cond: HeliosConditioning, start: int = 0, end: int | None = None) -> Tensor:
        """blocks[start:end] over tokens [B, S_hist + S, D]."""
        text = cond.text
        mask = text.mask() if isinstance(text, PromptKV) else None
        for index, block in enumerate(itertools.islice(self.blocks, start, end), start):
            x = block(x, cond, text.block(index) if isinstance(text, PromptKV) else text, mask)
        return x

    def block_input(self, x: Tensor, cond: HeliosConditioning, index: int = 0) -> Tensor:
        """The modulated tokens block `index` feeds to self-attention, given its input x."""
        block = self.blocks[index]
        now = (block.modulation.float() + cond.time_mod.float()).chunk(6, dim=1)
        past = (block.modulation.float() + cond.history_mod.float()).chunk(6, dim=1)
        return modulate_segments(x, cond.num_history, past[:2], now[:2], self.config.eps)

    def head(self, x: Tensor, cond: HeliosConditioning) -> Tensor:
        """The chunk's tokens after the last block -> prediction [B, C_out, F, H, W] (history dropped)."""
        cfg = self.config
        p_t, p_h, p_w = cfg.patch_size
        batch, _, frames, height, width = cond.latent_shape
        shift, scale = (self.out_modulation + cond.temb.unsqueeze(1)).chunk(2, dim=1)  # 2 x [B, 1, D]
        x = self.sequence.gather_joint(x, cond.length)[:, cond.history_tokens:]
        x = self.proj_out(modulate(x, shift, scale, cfg.eps))
        x = x.reshape(batch, *cond.grid, p_t, p_h, p_w, cfg.out_channels).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(batch, cfg.out_channels, frames, height, width)
