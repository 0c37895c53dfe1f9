"""The SANA-WM stage-1 DiT: a bidirectional, camera-controlled linear-attention video transformer.

Loads diffusers `SanaWMTransformer3DModel` checkpoints through SANA_WM_NAME_MAP; blocks follow the
reference's order of operations (adaLN-single with per-frame modulation, camera-aware self-attention,
plucker embedding after attention, text cross-attention, gated conv FFN), the module layout is ours.

Under sequence parallel (runtime.parallel.ulysses.apply_sp swaps `sequence` for `sharded_sequence`) each rank
keeps a band of patch rows of every frame from embedding to the output projection (parallel.FrameRows says why).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.block_stack import BlockStack
from vidloom.layers.fused_linear import linear_gelu_tanh
from vidloom.loading.name_map import NameMap
from vidloom.families.sana_wm.attention import CameraSelfAttention, CrossAttention, RMSNorm
from vidloom.families.sana_wm.config import SanaWMConfig
from vidloom.families.sana_wm.parallel import FrameRows
from vidloom.families.sana_wm.rays import ray_transforms, rope_table
from vidloom.layers.prompt_kv import PromptKV, prepare_prompt_kv
from vidloom.layers.sequence import WHOLE_SEQUENCE, WholeSequence
from vidloom.layers.timestep import timestep_features

TIMESTEP_CHANNELS = 256


class ConvFFN(nn.Module):
    """GLU inverted bottleneck over each frame (1x1 -> depthwise 3x3 -> gate -> 1x1), plus a residual
    temporal conv over frames (SANA-Video's GLUMBConvTemp)."""

    def __init__(self, dim: int, hidden: int, t_kernel: int) -> None:
        super().__init__()
        self.inverted = nn.Conv2d(dim, 2 * hidden, 1)
        self.depthwise = nn.Conv2d(2 * hidden, 2 * hidden, 3, padding=1, groups=2 * hidden)
        self.point = nn.Conv2d(hidden, dim, 1, bias=False)
        self.temporal = nn.Conv2d(dim, dim, (t_kernel, 1), padding=(t_kernel // 2, 0), bias=False)

    def forward(self, x: Tensor, grid: tuple[int, int, int], rows: FrameRows | None = None) -> Tensor:
        """x [B, N, C] over `grid`; with `rows`, x and grid are this rank's band and the 3x3 conv reads its halo."""
        b, n, c = x.shape
        f, h, w = grid
        y = F.silu(self.inverted(x.reshape(b * f, h, w, c).permute(0, 3, 1, 2)))
        if rows is None:
            y = self.depthwise(y)
        else:
            conv = self.depthwise
            y = F.conv2d(rows.halo(y), conv.weight, conv.bias, padding=(0, 1), groups=conv.groups)
        value, gate = y.chunk(2, dim=1)
        y = self.point(value * F.silu(gate)).view(b, f, c, h * w).permute(0, 2, 1, 3)
        y = y + self.temporal(y)
        return y.permute(0, 2, 3, 1).reshape(b, n, c)


class MLP(nn.Module):
    """fc1 -> tanh-GELU -> fc2 (the caption projection, and the FFN when ffn_type is "mlp"); fc1 and its GELU run
    as one oneDNN GEMM in float32 CPU inference (layers.fused_linear)."""

    def __init__(self, dim_in: int, hidden: int, dim_out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim_in, hidden)
        self.fc2 = nn.Linear(hidden, dim_out)

    def forward(self, x: Tensor, grid: tuple[int, int, int] | None = None, rows: FrameRows | None = None) -> Tensor:
        return self.fc2(linear_gelu_tanh(self.fc1, x))


class SanaWMBlock(nn.Module):
    def __init__(self, config: SanaWMConfig, index: int) -> None:
        super().__init__()
        dim = config.hidden_size
        self.self_attn = CameraSelfAttention(
            dim, config.self_attn_heads, qk_norm=config.qk_norm, softmax=config.is_softmax_block(index),
            conv_kernel=config.conv_kernel_size, k_conv_only=config.k_conv_only)
        self.cross_attn = CrossAttention(dim, config.num_attention_heads, config.cross_norm)
        hidden = int(dim * config.mlp_ratio)
        self.ffn = ConvFFN(dim, hidden, config.t_kernel_size) if config.ffn_type == "GLUMBConvTemp" \
            else MLP(dim, hidden, dim)
        self.plucker_proj = nn.Linear(dim, dim) if config.has_plucker_proj(index) else None
        self.scale_shift_table = nn.Parameter(torch.zeros(6, dim))

    def forward(self, x: Tensor, text: Tensor, text_mask: Tensor, mod: Tensor, grid: tuple[int, int, int],
                rope: Tensor | None, rays, plucker: Tensor | None, rows: FrameRows | None = None) -> Tensor:
        """x [B, N, C]; mod [B, T, 6*C] (per-frame timestep modulation). With `rows` (sequence parallel) x,
        plucker and grid are this rank's band; rope and rays stay the whole grid's (attention sees every token)."""
        b, n, c = x.shape
        frames = mod.shape[1]
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = self._modulation(mod, b, c)
        per_frame = lambda t: t.reshape(b, frames, -1, c)  # noqa: E731
        h = (per_frame(F.layer_norm(x, (c,), eps=1e-6)) * (1 + scale_a) + shift_a).reshape(b, n, c)
        x = x + (gate_a * per_frame(self.self_attn(h, grid, rope, rays, rows))).reshape(b, n, c)
        if plucker is not None and self.plucker_proj is not None:
            x = x + self.plucker_proj(plucker)
        x = x + self.cross_attn(x, text, text_mask)
        h = (per_frame(F.layer_norm(x, (c,), eps=1e-6)) * (1 + scale_f) + shift_f).reshape(b, n, c)
        return x + (gate_f * per_frame(self.ffn(h, grid, rows))).reshape(b, n, c)

    def self_attention_input(self, x: Tensor, mod: Tensor) -> Tensor:
        """The per-frame modulated tokens [B, N, C] self-attention reads (forward's first `h`)."""
        b, n, c = x.shape
        shift_a, scale_a = self._modulation(mod, b, c)[:2]
        return (F.layer_norm(x, (c,), eps=1e-6).reshape(b, mod.shape[1], -1, c) * (1 + scale_a) + shift_a) \
            .reshape(b, n, c)

    def _modulation(self, mod: Tensor, b: int, c: int) -> tuple[Tensor, ...]:
        return (self.scale_shift_table[None, None] + mod.reshape(b, mod.shape[1], 6, c)).chunk(6, dim=-2)


@dataclass(frozen=True)
class SanaWMConditioning:
    """What every block and the head read for one call (SanaWMTransformer.embed builds it)."""

    text: Tensor | PromptKV  # projected caption [B, L, C], or every block's cross-attention K/V of it
    text_mask: Tensor  # [B, L]
    mod: Tensor  # per-frame block modulation [B, T, 6*C]
    emb: Tensor  # per-frame embedded timestep [B, T, C] (the output modulation's)
    grid: tuple[int, int, int]  # token grid (frames, height, width)
    rope: Tensor | None
    rays: Any  # the camera's per-token ray transforms, or None
    plucker: Tensor | None  # plucker tokens [B, N, C] (this rank's band under sequence parallel)
    rows: FrameRows | None = None  # sequence parallel's layout; None: every token on this device

    @property
    def band(self) -> tuple[int, int, int]:
        """The grid of the tokens this device holds: the whole grid, or its band of patch rows."""
        return self.grid if self.rows is None else self.rows.band(self.grid)


class SanaWMTransformer(BlockStack, nn.Module):
    """Latents [B, C, F, H, W] + per-frame timesteps [B, F] + text + camera -> velocity-like prediction."""

    # Which tokens this device holds: all of them, unless sequence parallel swapped in `sharded_sequence`'s layout
    # from outside (runtime.parallel.ulysses.apply_sp). The self-attentions exchange through it themselves, so
    # self_attentions() yields none for apply_sp to wrap.
    sequence: WholeSequence | FrameRows = WHOLE_SEQUENCE
    sharded_sequence = FrameRows

    def __init__(self, config: SanaWMConfig) -> None:
        super().__init__()
        self.config = config
        dim, patch = config.hidden_size, tuple(config.patch_size)
        self.patch_embed = nn.Conv3d(config.in_channels, dim, patch, stride=patch)
        self.plucker_embed = nn.Conv3d(config.chunk_plucker_channels, dim, patch, stride=patch)
        self.time_up = nn.Linear(TIMESTEP_CHANNELS, dim)
        self.time_down = nn.Linear(dim, dim)
        self.time_mod = nn.Linear(dim, 6 * dim)
        self.caption_proj = MLP(config.caption_channels, dim, dim)
        self.caption_norm = RMSNorm(dim, 1e-5) if config.y_norm else None
        self.blocks = nn.ModuleList(SanaWMBlock(config, i) for i in range(config.num_layers))
        self.out_scale_shift = nn.Parameter(torch.zeros(2, dim))
        self.proj_out = nn.Linear(dim, math.prod(patch) * config.in_channels)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embed.weight.dtype

    def self_attentions(self) -> Iterator[nn.Module]:
        """None for apply_sp to wrap: each block's self-attention exchanges heads through FrameRows itself."""
        return iter(())

    def forward(self, latents: Tensor, timestep: Tensor, text: Tensor, text_mask: Tensor, camera: Tensor | None,
                plucker: Tensor | None) -> Tensor:
        """latents [B, C, F, H, W]; timestep [B, F] (0..1000, truncated to integers as the reference does);
        text [B, L, D_text] with mask [B, L]; camera [B, F, 20] (flattened first-frame-relative c2w + fx, fy,
        cx, cy in latent pixels) or None; plucker [B, 6*t_stride, F, H, W] or None."""
        stream, cond = self.embed(latents, timestep, text, text_mask, camera, plucker)
        return self.head(self.run_blocks(stream, cond), cond)

    # The stages below are the denoiser contract (core.denoiser.StagedDenoiser); forward() is exactly their
    # composition. The residual stream is the token sequence [B, N, C].

    def prepare_prompt(self, text: Tensor) -> PromptKV:
        """Every block's cross-attention keys/values of text [B, L, D_text] (core.denoiser.PreparesPrompt): what
        embed's `text` takes instead."""
        return prepare_prompt_kv([block.cross_attn for block in self.blocks], self._caption, text)

    def _caption(self, text: Tensor) -> Tensor:
        y = self.caption_proj(text.to(self.dtype))
        return self.caption_norm(y) if self.caption_norm is not None else y

    def embed(self, latents: Tensor, timestep: Tensor, text: Tensor | PromptKV, text_mask: Tensor,
              camera: Tensor | None, plucker: Tensor | None) -> tuple[Tensor, SanaWMConditioning]:
        """Inputs (as forward; `text` may be prepare_prompt(text)) -> the token stream and what every block and the
        head read."""
        cfg = self.config
        b = latents.shape[0]
        pf, ph, pw = cfg.patch_size
        grid = (latents.shape[2] // pf, latents.shape[3] // ph, latents.shape[4] // pw)
        x = self.patch_embed(latents.to(self.dtype)).flatten(2).transpose(1, 2)
        plucker_tokens = None
        if plucker is not None:
            plucker_tokens = self.plucker_embed(plucker.to(self.dtype)).flatten(2).transpose(1, 2)
        rope = rope_table(cfg.head_dim, grid, x.device) if cfg.use_pe else None
        rays = None
        if camera is not None:
            if rope is None:
                raise ValueError("the camera branch needs RoPE (use_pe)")
            rays = ray_transforms(camera, grid, tuple(cfg.patch_size), rope, cfg.head_dim)

        t = timestep.long().to(torch.float32)
        emb = self.time_down(F.silu(self.time_up(timestep_features(t.flatten(), TIMESTEP_CHANNELS).to(self.dtype))))
        mod = self.time_mod(F.silu(emb)).view(b, grid[0], -1)
        emb = emb.view(b, grid[0], -1)

        y = text if isinstance(text, PromptKV) else self._caption(text)
        rows = self.sequence
        if not isinstance(rows, FrameRows):
            return x, SanaWMConditioning(y, text_mask, mod, emb, grid, rope, rays, plucker_tokens)
        plucker_tokens = None if plucker_tokens is None else rows.shard(plucker_tokens, grid)
        return rows.shard(x, grid), SanaWMConditioning(y, text_mask, mod, emb, grid, rope, rays, plucker_tokens, rows)

    def run_blocks(self, x: Tensor, cond: SanaWMConditioning, start: int = 0, end: int | None = None) -> Tensor:
        """Blocks [start, end) over the token stream."""
        text = cond.text
        for index in range(start, self.num_blocks if end is None else end):
            x = self.blocks[index](x, text.block(index) if isinstance(text, PromptKV) else text, cond.text_mask,
                                   cond.mod, cond.band, cond.rope, cond.rays, cond.plucker, cond.rows)
        return x

    def block_input(self, x: Tensor, cond: SanaWMConditioning, index: int = 0) -> Tensor:
        """The per-frame modulated tokens block `index` feeds to self-attention (TeaCache's indicator)."""
        return self.blocks[index].self_attention_input(x, cond.mod)

    def head(self, x: Tensor, cond: SanaWMConditioning) -> Tensor:
        """Tokens after the last block -> the prediction [B, C, F, H, W]."""
        b, grid = x.shape[0], cond.grid
        shift, scale = (self.out_scale_shift[None, None] + cond.emb[:, :, None]).chunk(2, dim=-2)
        c = x.shape[-1]
        x = (F.layer_norm(x, (c,), eps=1e-6).reshape(b, grid[0], -1, c) * (1 + scale) + shift).reshape(b, -1, c)
        x = self.proj_out(x)
        return self._unpatchify(x if cond.rows is None else cond.rows.gather(x, grid[0]), grid)

    def _unpatchify(self, x: Tensor, grid: tuple[int, int, int]) -> Tensor:
        pf, ph, pw = self.config.patch_size
        f, h, w = grid
        c = self.config.in_channels
        x = x.reshape(x.shape[0], f, h, w, pf, ph, pw, c)
        return torch.einsum("nfhwopqc->ncfohpwq", x).reshape(x.shape[0], c, f * pf, h * ph, w * pw)


_B = "blocks.{n}"
SANA_WM_NAME_MAP = NameMap((
    ("x_embedder.proj", "patch_embed"),
    ("plucker_embedder.proj", "plucker_embed"),
    ("t_embedder.linear_1", "time_up"),
    ("t_embedder.linear_2", "time_down"),
    ("t_block.1", "time_mod"),
    ("y_embedder.y_proj", "caption_proj"),
    ("attention_y_norm", "caption_norm"),
    ("final_layer.linear", "proj_out"),
    ("final_layer.scale_shift_table", "out_scale_shift"),
    (f"{_B}.attn", f"{_B}.self_attn"),
    (f"{_B}.mlp.inverted_conv.conv", f"{_B}.ffn.inverted"),
    (f"{_B}.mlp.depth_conv.conv", f"{_B}.ffn.depthwise"),
    (f"{_B}.mlp.point_conv.conv", f"{_B}.ffn.point"),
    (f"{_B}.mlp.t_conv", f"{_B}.ffn.temporal"),
    (f"{_B}.mlp", f"{_B}.ffn"),
))
# The absolute-map camera embedder only feeds a path the released configuration switches off
# (use_chunk_plucker_post_attn=True, which our config requires).
SANA_WM_UNUSED_PREFIXES = ("raymap_embedder",)
