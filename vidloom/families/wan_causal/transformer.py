"""AnyFlow-FAR causal Wan transformer: block-causal attention over chunks with a per-layer KV cache.

Numerically matches diffusers' AnyFlowFARTransformer3DModel on its KV-cache paths.
The backbone pieces (attention projections, MLPs, timestep features, RoPE) are
Wan2.1's; FAR adds a second, coarser patch embedding for old chunks, a per-frame
dual-timestep (t, r) embedding for flow-map sampling, and three ways to run
self-attention, all over the same weights:

- `prefill`:   context chunks (clean, t = r = 0), block-causal; writes every layer's K/V.
- `step`:      the generated chunk only, attending to the cached context K/V.
- `recompute`: context and generated chunk in one pass, no cache (the reference answer
               the cache must reproduce, and a fallback that needs no slab).

Under sequence parallel (runtime.parallel.ulysses.apply_sp swaps `sequence` for `sharded_sequence` and wraps every
block's self-attention) each rank keeps its rows of every chunk from embedding to the head, and of every chunk's KV
in the slab (parallel.ChunkShards says how); the head gathers the generated chunk's rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn, attention
from vidloom.layers.block_stack import BlockStack
from vidloom.layers.fp8 import project
from vidloom.layers.sharded import each_resident
from vidloom.layers.timestep import timestep_features
from vidloom.models.wan.ops import apply_rope, gated_residual, modulate
from vidloom.models.wan.transformer import MLP, WanAttention
from vidloom.families.wan_causal.config import FarTransformerConfig
from vidloom.families.wan_causal.kv_cache import FarKVCache, FarKVStack
from vidloom.families.wan_causal.layout import ChunkLayout, per_token
from vidloom.families.wan_causal.parallel import WHOLE_CHUNKS, ChunkShards, WholeChunks
from vidloom.families.wan_causal.text import FarText

# (layer index, self-attention module, modulated tokens [B, S, D]) -> attention output [B, S, D]
SelfAttend = Callable[[int, WanAttention, Tensor], Tensor]


def block_causal_attention(
    attention_fn: AttentionFn, q: Tensor, k: Tensor, v: Tensor, ends: list[int], null_keys: int = 0,
    sequence: WholeChunks = WHOLE_CHUNKS,
) -> Tensor:
    """Attention over tokens [B, S, H, Dh] in chunk order: chunk i's queries see keys [0, ends[i]).

    One unmasked attention call per chunk over its visible prefix, so any kernel
    (SDPA, flash) serves it and no [S, S] mask is built. The last chunk also sees
    `null_keys` all-zero keys, as the generated chunk does when it reads the KV cache.
    Under sequence parallel q, k, v are this rank's rows of every chunk (`sequence`), its rows of chunks
    [0, i] a prefix of them, and the pad rows are masked out of the keys.
    """
    segments = [end - start for start, end in zip([0, *ends[:-1]], ends)]
    outputs, start, stop = [], 0, 0
    for i, length in enumerate(segments):
        stop += sequence.rows(length)
        keys, values, visible = k[:, :stop], v[:, :stop], segments[: i + 1]
        if null_keys and i == len(segments) - 1:
            null = k.new_zeros(k.shape[0], sequence.rows(null_keys), *k.shape[2:])
            keys, values = torch.cat([null, keys], dim=1), torch.cat([null, values], dim=1)
            visible = [null_keys, *visible]
        outputs.append(_attend(attention_fn, q[:, start:stop], keys, values, sequence.key_mask(visible)))
        start = stop
    return torch.cat(outputs, dim=1)


def _attend(attention_fn: AttentionFn, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
    """`key_mask`: a sharded key stream's real rows in rank order (ChunkShards.key_mask), for the sequence-parallel
    wrapper; one device passes none."""
    return attention_fn(q, k, v) if key_mask is None else attention_fn(q, k, v, key_mask)


def _project(attn: WanAttention, x: Tensor, rope: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v [B, S, H, Dh] of self-attention tokens x [B, S, D], RoPE (cos, sin pairs [S, Dh/2, 2]) on q and k."""
    q, k, v = project(x, attn.q, attn.k, attn.v)  # one shared FP8 quantization of x when deployed in FP8
    q = attn.norm_q(q).type_as(x).unflatten(-1, (attn.num_heads, -1))
    k = attn.norm_k(k).type_as(x).unflatten(-1, (attn.num_heads, -1))
    v = v.unflatten(-1, (attn.num_heads, -1))
    return apply_rope(q, rope), apply_rope(k, rope), v


class FarBlock(nn.Module):
    """Wan2.1 block with per-token modulation (every frame has its own timestep) and pluggable self-attention.

    Parameter names equal WanBlock's, so Wan's checkpoint table covers the blocks.
    """

    def __init__(self, config: FarTransformerConfig) -> None:
        super().__init__()
        wan = config.wan
        dim = wan.inner_dim
        self.eps = wan.eps
        self.self_attn = WanAttention(dim, wan.num_attention_heads, wan.eps)
        self.cross_norm = nn.LayerNorm(dim, eps=wan.eps) if wan.cross_attn_norm else None
        self.cross_attn = WanAttention(dim, wan.num_attention_heads, wan.eps)
        self.ffn = MLP(dim, wan.ffn_dim, dim, nn.GELU(approximate="tanh"))
        # Rows: (shift, scale, gate) for self-attention, then for the FFN.
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def text_kv(self, text: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values [B, L, H, Dh] of projected text tokens [B, L, D]."""
        attn = self.cross_attn
        k, v = project(text, attn.k, attn.v)
        return attn.norm_k(k).unflatten(-1, (attn.num_heads, -1)), v.unflatten(-1, (attn.num_heads, -1))

    def forward(self, index: int, x: Tensor, text: FarText, time_mod: Tensor, self_attend: SelfAttend) -> Tensor:
        # x: [B, S, D]; text: K/V [B, L, H, Dh] per layer; time_mod: [B, S, 6, D]
        mods = (self.modulation.float() + time_mod.float()).unbind(2)  # 6 x [B, S, D] fp32
        shift_sa, scale_sa, gate_sa, shift_ff, scale_ff, gate_ff = mods

        # 1. Self-attention (causal, cached or not: the caller decides)
        h = modulate(x, shift_sa, scale_sa, self.eps)
        x = gated_residual(x, self_attend(index, self.self_attn, h), gate_sa)

        # 2. Cross-attention to text, unmodulated
        if self.cross_norm is not None:
            h = F.layer_norm(x.float(), (x.shape[-1],), self.cross_norm.weight.float(),
                             self.cross_norm.bias.float(), self.eps).type_as(x)
        else:
            h = x
        attn = self.cross_attn
        q = attn.norm_q(attn.q(h)).unflatten(-1, (attn.num_heads, -1))
        x = x + attn.out(attn.attention_fn(q, text.keys[index], text.values[index]).flatten(-2))

        # 3. Feed-forward
        h = modulate(x, shift_ff, scale_ff, self.eps)
        return gated_residual(x, self.ffn(h), gate_ff)


@dataclass(frozen=True)
class FarConditioning:
    """What every block and the head read in one step (FarTransformer.embed_step / embed_recompute)."""

    time_mod: Tensor  # [B, S, 6, D] (this rank's rows under sequence parallel)
    temb: Tensor  # [B, S, D] (every row)
    text: FarText
    attend: SelfAttend  # the step's self-attention (cached or block-causal over the whole sequence)
    head_from: int  # first token the head predicts (the generated chunk's)
    shape: tuple[int, ...]  # the prediction's shape [B, C, F_gen, H, W]
    head_rows: int = 0  # this rank's first row of the generated chunk (head_from on one device)


@dataclass(frozen=True)
class _Tokens:
    """One forward's token stream and what every block reads with it."""

    x: Tensor  # [B, S, D] (this rank's rows of every chunk)
    temb: Tensor  # [B, S, D] per-token time embedding (offsets the output modulation), every row
    time_mod: Tensor  # [B, S, 6, D] (this rank's rows)
    rope: Tensor  # (cos, sin) pairs [S, Dh/2, 2] (this rank's rows)


class FarTransformer(BlockStack, nn.Module):
    """Causal Wan DiT predicting the flow-map mean velocity of one chunk from (t, r), text and earlier chunks.

    Holds no per-call state: the KV cache is an argument, owned by the caller's rollout.
    Latents are [B, C, F, H, W] everywhere, as in vidloom's Wan.
    """

    # Which rows of every chunk this device holds: all of them, unless sequence parallel swapped in
    # `sharded_sequence`'s layout from outside (runtime.parallel.ulysses.apply_sp, with self_attentions()).
    sequence: WholeChunks = WHOLE_CHUNKS
    sharded_sequence = ChunkShards

    KEEP_FP32: ClassVar[frozenset[str]] = frozenset({"time_embed", "modulation", "out_modulation", "cross_norm"})
    """Name segments kept in float32 under bf16/fp16, as the reference's `_keep_in_fp32_modules`."""

    def __init__(self, config: FarTransformerConfig, attention_fn: AttentionFn = attention) -> None:
        """`attention_fn` serves every attention call (all are unmasked: causality is by chunk prefixes)."""
        super().__init__()
        self.config = config
        self.attention_fn = attention_fn
        wan = config.wan
        dim = wan.inner_dim
        self.patch_embed = nn.Conv3d(wan.in_channels, dim, kernel_size=wan.patch_size, stride=wan.patch_size)
        self.far_patch_embed = nn.Conv3d(
            wan.in_channels, dim, kernel_size=config.compressed_patch_size, stride=config.compressed_patch_size
        )
        self.time_embed = MLP(wan.freq_dim, dim, dim, nn.SiLU())
        self.delta_embed = MLP(wan.freq_dim, dim, dim, nn.SiLU())
        self.time_modulation = nn.Linear(dim, 6 * dim)
        self.text_embed = MLP(wan.text_dim, dim, dim, nn.GELU(approximate="tanh"))
        self.blocks = nn.ModuleList(FarBlock(config) for _ in range(wan.num_layers))
        for block in self.blocks:
            block.self_attn.attention_fn = block.cross_attn.attention_fn = attention_fn
        self.out_modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)
        self.proj_out = nn.Linear(dim, wan.out_channels * math.prod(wan.patch_size))

    def self_attentions(self) -> Iterator[WanAttention]:
        """Every block's self-attention, over [null keys, context KV, chunk] (sequence parallel wraps it)."""
        return (block.self_attn for block in self.blocks)

    # -- public passes ----------------------------------------------------------

    def embed_text(self, text_embeds: Tensor) -> FarText:
        """Text encoder states [B, L, text_dim] -> every layer's cross-attention K/V; once per request."""
        tokens = self.text_embed(text_embeds)
        pairs = each_resident(self.blocks, lambda block: block.text_kv(tokens))  # gathered if sharded
        return FarText(tuple(k for k, _ in pairs), tuple(v for _, v in pairs))

    def new_cache(self, layouts: list[ChunkLayout], batch: int, device: torch.device, dtype: torch.dtype) -> FarKVCache:
        """A KV slab sized for a rollout whose chunks have these layouts (this rank's rows of them)."""
        wan = self.config.wan
        return FarKVCache.allocate(
            layouts, wan.num_layers, batch, wan.num_attention_heads, wan.attention_head_dim, device, dtype,
            self.sequence.rows,
        )

    def cache_key(self, layouts: list[ChunkLayout], batch: int, device: torch.device, dtype: torch.dtype) -> tuple:
        """Which slabs `new_cache` builds alike (a static slab's reuse key under cuda_graphs)."""
        wan = self.config.wan
        return FarKVCache.reuse_key(layouts, wan.num_layers, batch, wan.num_attention_heads, wan.attention_head_dim,
                                    device, dtype, self.sequence.rows)

    def cache_bytes(self, layouts: list[ChunkLayout], batch: int, dtype: torch.dtype) -> int:
        """Bytes `new_cache` takes (for admission before allocating)."""
        wan = self.config.wan
        return FarKVCache.bytes_needed(layouts, wan.num_layers, batch, wan.num_attention_heads,
                                       wan.attention_head_dim, dtype, self.sequence.rows)

    def prefill(self, context: Tensor, text: FarText, layout: ChunkLayout, cache: FarKVCache) -> None:
        """Write every layer's K/V of the clean context [B, C, F_ctx, H, W] (t = r = 0) into `cache`."""
        if context.shape[2] != layout.context_frames:
            raise ValueError(f"context has {context.shape[2]} frames, layout expects {layout.context_frames}")
        zeros = torch.zeros(context.shape[0], device=context.device)
        ends = layout.chunk_ends()[:-1]
        tokens = self._embed(context, zeros, zeros, layout, layout.frame_tokens()[: layout.context_frames], full=False,
                             segments=layout.chunk_tokens()[:-1])

        def attend(index: int, attn: WanAttention, h: Tensor) -> Tensor:
            q, k, v = _project(attn, h, tokens.rope)
            cache.write(index, 0, k, v)
            out = block_causal_attention(attn.attention_fn, q, k, v, ends, sequence=self.sequence)
            return attn.out(out.flatten(-2))

        self._run_blocks(tokens, text, attend)
        cache.context_tokens, cache.context_rows = layout.context_tokens, tokens.x.shape[1]

    def step(self, latents: Tensor, t: Tensor, r: Tensor, text: FarText, layout: ChunkLayout, cache: FarKVCache) -> Tensor:
        """Mean velocity [B, C, F_gen, H, W] of the generated chunk at (t, r) [B], given the prefilled cache."""
        x, cond = self.embed_step(latents, t, r, text, layout, cache)
        return self.head(self.run_blocks(x, cond), cond)

    def recompute(self, latents: Tensor, t: Tensor, r: Tensor, text: FarText, layout: ChunkLayout) -> Tensor:
        """Same as prefill + step, without a cache: latents [B, C, F_total, H, W] are context then chunk."""
        x, cond = self.embed_recompute(latents, t, r, text, layout)
        return self.head(self.run_blocks(x, cond), cond)

    # -- the staged denoiser contract (core.denoiser.StagedDenoiser) -------------
    # step() and recompute() are exactly embed_* -> run_blocks -> head. A cached step writes the
    # generated chunk's own K/V into the slab at every block, but only that step reads them back (the
    # next chunk's prefill rewrites the context from clean latents), so a step cache may skip blocks.

    def embed_step(
        self, latents: Tensor, t: Tensor, r: Tensor, text: FarText, layout: ChunkLayout, cache: FarKVCache | FarKVStack,
    ) -> tuple[Tensor, FarConditioning]:
        """The generated chunk's tokens and a self-attention that extends the prefilled cache (or each request's
        own, for a batched step: FarKVStack)."""
        if cache.context_tokens != layout.context_tokens:
            raise ValueError(
                f"KV cache holds {cache.context_tokens} context tokens; this chunk needs {layout.context_tokens} "
                "(prefill it first)"
            )
        per_frame = layout.frame_tokens()[layout.context_frames :]
        tokens = self._embed(latents, t, r, layout, per_frame, full=True, segments=[layout.generated_tokens])
        start = cache.context_rows
        # Keys: the null keys, the context chunks, this chunk (this rank's rows of each, under sequence parallel).
        key_mask = self.sequence.key_mask([layout.null_keys, *layout.chunk_tokens()])
        null = self.sequence.rows(layout.null_keys)

        def attend(index: int, attn: WanAttention, h: Tensor) -> Tensor:
            q, k, v = _project(attn, h, tokens.rope)
            out = cache.step_attention(index, start, null, q, k, v,
                                       lambda q, k, v: _attend(attn.attention_fn, q, k, v, key_mask))
            return attn.out(out.flatten(-2))

        return tokens.x, FarConditioning(tokens.time_mod, tokens.temb, text, attend, 0, tuple(latents.shape))

    def embed_recompute(
        self, latents: Tensor, t: Tensor, r: Tensor, text: FarText, layout: ChunkLayout,
    ) -> tuple[Tensor, FarConditioning]:
        """Context then chunk tokens, attending block-causally; the head keeps the chunk's."""
        if latents.shape[2] != layout.total_frames:
            raise ValueError(f"latents have {latents.shape[2]} frames, layout expects {layout.total_frames}")
        batch = latents.shape[0]
        frames = torch.zeros(batch, layout.total_frames, device=latents.device, dtype=t.dtype)
        t_frames = frames.clone()
        r_frames = frames.clone()
        t_frames[:, layout.context_frames :] = t[:, None]
        r_frames[:, layout.context_frames :] = r[:, None]
        segments = layout.chunk_tokens()
        tokens = self._embed(latents, t_frames, r_frames, layout, layout.frame_tokens(), full=False, segments=segments)
        ends = layout.chunk_ends()

        def attend(index: int, attn: WanAttention, h: Tensor) -> Tensor:
            q, k, v = _project(attn, h, tokens.rope)
            out = block_causal_attention(attn.attention_fn, q, k, v, ends, layout.null_keys, self.sequence)
            return attn.out(out.flatten(-2))

        chunk_shape = (*latents.shape[:2], layout.generated_frames, *latents.shape[3:])
        head_rows = sum(self.sequence.rows(n) for n in segments[:-1])
        return tokens.x, FarConditioning(tokens.time_mod, tokens.temb, text, attend, layout.context_tokens,
                                         chunk_shape, head_rows)

    def run_blocks(self, x: Tensor, cond: FarConditioning, start: int = 0, end: int | None = None) -> Tensor:
        """Blocks [start, end) over the token stream."""
        for index in range(start, self.num_blocks if end is None else end):
            x = self.blocks[index](index, x, cond.text, cond.time_mod, cond.attend)
        return x

    def block_input(self, x: Tensor, cond: FarConditioning, index: int = 0) -> Tensor:
        """The modulated tokens block `index` feeds to self-attention (TeaCache's indicator)."""
        shift, scale = (self.blocks[index].modulation.float() + cond.time_mod.float()).unbind(2)[:2]
        return modulate(x, shift, scale, self.config.wan.eps)

    def head(self, x: Tensor, cond: FarConditioning) -> Tensor:
        """Tokens after the last block -> the generated chunk's prediction [B, C_out, F, H, W]."""
        chunk = self.sequence.gather(x[:, cond.head_rows :], cond.temb.shape[1] - cond.head_from)
        return self._head(chunk, cond.temb[:, cond.head_from :], cond.shape)

    # -- stages -------------------------------------------------------------------

    def _embed(
        self, latents: Tensor, t: Tensor, r: Tensor, layout: ChunkLayout, frame_tokens: list[int], full: bool,
        segments: list[int],
    ) -> _Tokens:
        """Tokens, per-token time conditioning and RoPE for `latents` ([B, C, F, H, W], F = len(frame_tokens)),
        this rank's rows of each of `segments` (the chunks' token counts).

        `full`: every frame is the generated chunk (embedded at full resolution, RoPE
        rows of the generated tokens); otherwise the frames start at the sequence start.
        t, r: [B] (one value per sample) or [B, F] (per frame).
        """
        num_frames = latents.shape[2]
        if full:
            x = self._patchify(self.patch_embed, latents)
        else:
            comp = layout.compressed_frames
            parts = [self._patchify(self.patch_embed, latents[:, :, comp:])]
            if comp:
                parts.insert(0, self._patchify(self.far_patch_embed, latents[:, :, :comp]))
            x = torch.cat(parts, dim=1)
        if t.ndim == 1:
            t, r = t[:, None].expand(-1, num_frames), r[:, None].expand(-1, num_frames)
        temb, time_mod = self._time(t, r, x.dtype)
        temb, time_mod = per_token(temb, frame_tokens), per_token(time_mod, frame_tokens)
        cos, sin = layout.rope(self.config.wan.attention_head_dim, self.config.spatial_downscale, latents.device)
        if full:
            rows = slice(layout.context_tokens, layout.total_tokens)
        else:
            rows = slice(0, x.shape[1])
        rope = self.sequence.take(torch.stack((cos[rows], sin[rows]), dim=-1), segments, dim=0)
        take = self.sequence.take
        return _Tokens(take(x, segments), temb, take(time_mod, segments), rope)

    @staticmethod
    def _patchify(conv: nn.Conv3d, latents: Tensor) -> Tensor:
        return conv(latents).flatten(2).transpose(1, 2)  # [B, f*h*w, D], frames-major

    def _time(self, t: Tensor, r: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Per-frame (t, r) [B, F] -> time embedding [B, F, D] and modulation [B, F, 6, D]."""
        cfg = self.config
        batch, frames = t.shape
        delta = r if cfg.deltatime_type == "r" else t - r
        emb_t = self._embed_time(self.time_embed, t.reshape(-1)).to(dtype)
        emb_d = self._embed_time(self.delta_embed, delta.reshape(-1)).to(dtype)
        # Gate as a float32 tensor in the delta embedder's dtype, as the reference rounds it; filled on the device
        # (a captured step copies nothing from the host).
        gate = torch.full((1,), cfg.gate_value, dtype=torch.float32, device=t.device).to(self.delta_embed.up.weight.dtype)
        temb = (1 - gate) * emb_t + gate * emb_d
        time_mod = self.time_modulation(F.silu(temb))
        return temb.unflatten(0, (batch, frames)), time_mod.unflatten(0, (batch, frames)).unflatten(-1, (6, -1))

    def _embed_time(self, mlp: MLP, timesteps: Tensor) -> Tensor:
        features = timestep_features(timesteps, self.config.wan.freq_dim)
        return mlp(features.to(mlp.up.weight.dtype))

    def _run_blocks(self, tokens: _Tokens, text: FarText, attend: SelfAttend) -> Tensor:
        x = tokens.x
        for index, block in enumerate(self.blocks):
            x = block(index, x, text, tokens.time_mod, attend)
        return x

    def _head(self, x: Tensor, temb: Tensor, shape: tuple[int, ...] | torch.Size) -> Tensor:
        """Tokens [B, S, D] of the generated chunk -> prediction [B, C_out, F, H, W]."""
        wan = self.config.wan
        batch, _, frames, height, width = shape
        _, p_h, p_w = wan.patch_size
        shift, scale = (self.out_modulation.float() + temb.float()[:, :, None]).unbind(2)
        x = modulate(x, shift, scale, wan.eps)
        x = self.proj_out(x)
        # [B, f, h, w, p_h, p_w, C] -> [B, C, F, H, W]
        x = x.reshape(batch, frames, height // p_h, width // p_w, p_h, p_w, wan.out_channels)
        x = x.permute(0, 6, 1, 2, 4, 3, 5)
        return x.reshape(batch, wan.out_channels, frames, height, width)
