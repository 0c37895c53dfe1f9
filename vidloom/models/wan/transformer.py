"""Wan diffusion transformer (DiT), numerically matching diffusers' WanTransformer3DModel.

One module covers the family: Wan2.1 T2V, Wan2.1 I2V / first-last-frame (CLIP image tokens
through extra key/value projections in cross-attention), and Wan2.2 (TI2V-5B's per-token
timesteps; each A14B expert is a plain T2V/I2V-shaped DiT).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from collections.abc import Iterator
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn, attention
from vidloom.layers.block_stack import BlockStack
from vidloom.layers.fp8 import project
from vidloom.layers.fused_linear import linear_gelu_tanh
from vidloom.layers.prompt_kv import PADDING_KEY_MULTIPLE, PromptKV, prepare_prompt_kv
from vidloom.layers.rms_norm import RMSNorm
from vidloom.layers.sequence import WHOLE_SEQUENCE, SequenceLayout
from vidloom.layers.timestep import timestep_features
from vidloom.models.wan.ops import apply_rope, gated_residual, modulate, rope_freqs
from vidloom.models.wan.transformer_config import WanTransformerConfig

# diffusers' FP32LayerNorm default; the image embedder's norms use it (the blocks use config.eps).
IMAGE_NORM_EPS = 1e-5


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------


def _layer_norm_fp32(x: Tensor, norm: nn.LayerNorm | None, eps: float) -> Tensor:
    """LayerNorm in float32 whatever the input dtype; half-precision variance is too coarse here."""
    weight = norm.weight.float() if norm is not None else None
    bias = norm.bias.float() if norm is not None else None
    return F.layer_norm(x.float(), (x.shape[-1],), weight, bias, eps)


class MLP(nn.Module):
    """Linear -> activation -> Linear; used for the time, text and feed-forward paths."""

    def __init__(self, dim_in: int, dim_hidden: int, dim_out: int, activation: nn.Module) -> None:
        super().__init__()
        self.up = nn.Linear(dim_in, dim_hidden)
        self.act = activation
        self.down = nn.Linear(dim_hidden, dim_out)

    def forward(self, x: Tensor) -> Tensor:
        if isinstance(self.act, nn.GELU) and self.act.approximate == "tanh":  # one oneDNN call on a CPU
            return self.down(linear_gelu_tanh(self.up, x))
        return self.down(self.act(self.up(x)))


class WanAttention(nn.Module):
    """Multi-head attention with RMSNorm on q and k over all heads jointly (before the head split)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        eps: float,
        attention_fn: AttentionFn = attention,
        image_dim: int | None = None,
    ) -> None:
        """`image_dim` (cross-attention of I2V models): width of the image tokens given extra k/v projections."""
        super().__init__()
        self.num_heads = num_heads
        self.attention_fn = attention_fn  # chosen at load (DeployConfig.attention_backend)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps=eps)
        self.norm_k = RMSNorm(dim, eps=eps)
        self.image_k = nn.Linear(image_dim, dim) if image_dim is not None else None
        self.image_v = nn.Linear(image_dim, dim) if image_dim is not None else None
        self.image_norm_k = RMSNorm(dim, eps=eps) if image_dim is not None else None

    def context_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (RMS-normed) and values [B, L, H, Dh] of context tokens [B, L, D]: what forward's `kv` takes, so a
        context that does not change between calls (a request's prompt) is projected once (layers.prompt_kv)."""
        k, v = project(context, self.k, self.v)  # one shared FP8 quantization of the context when deployed in FP8
        return self.norm_k(k).unflatten(-1, (self.num_heads, -1)), v.unflatten(-1, (self.num_heads, -1))

    def forward(self, x: Tensor, context: Tensor | tuple[Tensor, Tensor], rope: Tensor | None = None,
                image: Tensor | tuple[Tensor, Tensor] | None = None, mask: Tensor | None = None) -> Tensor:
        # x: [B, S, D] queries; context: [B, L, D] keys/values (x itself for self-attention), or context_kv(context)
        # computed earlier (then not rotated). `project` shares one quantized input between projections in FP8.
        # mask: an additive key bias [B, 1, 1, L] on the context's scores (collapsed prompt padding, PromptKV.mask).
        if context is x:
            q, k, v = project(x, self.q, self.k, self.v)
            k = self.norm_k(k).unflatten(-1, (self.num_heads, -1))  # [B, L, H, Dh]
            v = v.unflatten(-1, (self.num_heads, -1))  # [B, L, H, Dh]
        else:
            (q,) = project(x, self.q)
            k, v = context if isinstance(context, tuple) else self.context_kv(context)
        q = self.norm_q(q).unflatten(-1, (self.num_heads, -1))  # [B, S, H, Dh]
        if rope is not None:
            q = apply_rope(q, rope)
            k = apply_rope(k, rope)
        out = self.attention_fn(q, k, v, mask).flatten(-2)  # [B, S, D]
        if image is not None:
            # I2V: the same queries attend separately to the image tokens [B, I, D] (or image_kv's); the two
            # results are summed before the output projection (diffusers' WanAttnProcessor order).
            out = out + self._image_attention(q, image)
        return self.out(out)

    def image_kv(self, image: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (RMS-normed) and values [B, I, H, Dh] of projected image tokens [B, I, D] (I2V): what forward's
        `image` takes, so a request's image tokens are projected once (WanTransformer.prepare_image)."""
        if self.image_k is None or self.image_v is None or self.image_norm_k is None:
            raise ValueError("image tokens given to an attention layer without image projections")
        k = self.image_norm_k(self.image_k(image)).unflatten(-1, (self.num_heads, -1))
        return k, self.image_v(image).unflatten(-1, (self.num_heads, -1))

    def _image_attention(self, q: Tensor, image: Tensor | tuple[Tensor, Tensor]) -> Tensor:
        k, v = image if isinstance(image, tuple) else self.image_kv(image)
        return self.attention_fn(q, k, v).flatten(-2)


class WanImageEmbed(nn.Module):
    """CLIP image tokens [N, I, image_dim] -> cross-attention tokens [B, I', D] (norm -> GELU MLP -> norm).

    With a position table (first-last-frame checkpoints), the tokens of each sample's images
    are first joined into one sequence of `pos_embed_seq_len` tokens (two images of I each).
    """

    def __init__(self, image_dim: int, dim: int, pos_embed_seq_len: int | None) -> None:
        super().__init__()
        self.norm_in = nn.LayerNorm(image_dim, eps=IMAGE_NORM_EPS)
        self.mlp = MLP(image_dim, image_dim, dim, nn.GELU())
        self.norm_out = nn.LayerNorm(dim, eps=IMAGE_NORM_EPS)
        self.pos_embed = (
            nn.Parameter(torch.zeros(1, pos_embed_seq_len, image_dim)) if pos_embed_seq_len is not None else None
        )

    def forward(self, image: Tensor) -> Tensor:
        if self.pos_embed is not None:
            length = self.pos_embed.shape[1]
            if image.shape[0] * image.shape[1] % length:
                raise ValueError(f"{tuple(image.shape)} image tokens do not form sequences of {length}")
            image = image.reshape(-1, length, image.shape[-1]) + self.pos_embed
        h = _layer_norm_fp32(image, self.norm_in, IMAGE_NORM_EPS).type_as(image)
        h = self.mlp(h)
        return _layer_norm_fp32(h, self.norm_out, IMAGE_NORM_EPS).type_as(h)


class WanBlock(nn.Module):
    """Self-attention (RoPE) -> cross-attention to text -> FFN, with timestep-driven AdaLN.

    The modulation arithmetic and the residual adds around self-attention and the FFN
    run in float32 so that bf16/fp16 weights change only the matmuls.
    """

    def __init__(
        self,
        config: WanTransformerConfig,
        attention_fn: AttentionFn = attention,
        cross_attention_fn: AttentionFn | None = None,
    ) -> None:
        super().__init__()
        dim = config.inner_dim
        self.eps = config.eps
        self.self_attn = WanAttention(dim, config.num_attention_heads, config.eps, attention_fn)
        self.cross_norm = nn.LayerNorm(dim, eps=config.eps) if config.cross_attn_norm else None
        self.cross_attn = WanAttention(
            dim, config.num_attention_heads, config.eps, cross_attention_fn or attention_fn, config.added_kv_proj_dim
        )
        self.ffn = MLP(dim, config.ffn_dim, dim, nn.GELU(approximate="tanh"))
        # Learned per-block offsets added to the shared timestep modulation:
        # rows are (shift, scale, gate) for self-attention then for the FFN.
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(
        self, x: Tensor, text: Tensor | tuple[Tensor, Tensor], time_mod: Tensor, rope: Tensor,
        image: Tensor | tuple[Tensor, Tensor] | None = None, text_mask: Tensor | None = None,
    ) -> Tensor:
        # x: [B, S, D]; text: [B, L, D], or its cross-attention (keys, values) [B, L, H, Dh]; time_mod: [B, 6, D], or [B, S, 6, D] with per-token timesteps
        # image: [B, I, D] projected CLIP tokens (I2V models), or their (keys, values) [B, I, H, Dh], or None
        shift_sa, scale_sa, gate_sa, shift_ff, scale_ff, gate_ff = self._modulations(time_mod)

        # 1. Self-attention over all video tokens: [B, S, D]
        h = self._modulate(x, shift_sa, scale_sa)
        x = gated_residual(x, self.self_attn(h, h, rope), gate_sa)

        # 2. Cross-attention to text, unmodulated and ungated: [B, S, D] x [B, L, D] -> [B, S, D]
        h = _layer_norm_fp32(x, self.cross_norm, self.eps).type_as(x) if self.cross_norm is not None else x
        x = x + self.cross_attn(h, text, image=image, mask=text_mask)

        # 3. Feed-forward: [B, S, D] -> [B, S, ffn_dim] -> [B, S, D]
        h = self._modulate(x, shift_ff, scale_ff)
        return gated_residual(x, self.ffn(h), gate_ff)

    def attention_input(self, x: Tensor, time_mod: Tensor) -> Tensor:
        """The normalised, timestep-modulated tokens [B, S, D] this block feeds to self-attention."""
        shift_sa, scale_sa = self._modulations(time_mod)[:2]
        return self._modulate(x, shift_sa, scale_sa)

    def _modulations(self, time_mod: Tensor) -> tuple[Tensor, ...]:
        """Six fp32 modulation tensors, [B, 1, D] each (shared timestep) or [B, S, D] (per-token)."""
        if time_mod.ndim == 4:
            return (self.modulation.float().unsqueeze(0) + time_mod.float()).unbind(2)
        return (self.modulation.float() + time_mod.float()).chunk(6, dim=1)

    def _modulate(self, x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
        return modulate(x, shift, scale, self.eps)


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WanConditioning:
    """What every block of one forward call reads; built by `embed`, never kept on the module."""

    text: Tensor | PromptKV
    """Projected text tokens [B, L, D], or every block's cross-attention keys/values of them (prepare_prompt)."""
    temb: Tensor
    """Timestep embedding [B, D]; offsets the output modulation."""
    time_mod: Tensor
    """Shared per-block modulation [B, 6, D]."""
    rope: Tensor
    """RoPE (cos, sin) pairs [S, Dh/2, 2] for this rank's tokens (all S unless the sequence is sharded)."""
    grid: tuple[int, int, int]
    """Patch grid (f, h, w)."""
    latent_shape: tuple[int, int, int, int, int]
    """Shape (B, C_in, F, H, W) of the latents, for unpatchify."""
    image: Tensor | PromptKV | None = None
    """Projected CLIP image tokens [B, I, D] for cross-attention (I2V models), or every block's keys/values of them
    (prepare_image), or None."""


class WanTransformer(BlockStack, nn.Module):
    """Wan2.1 T2V DiT: predicts the flow-matching velocity of video latents from a timestep and text.

    Holds no per-call state, so one instance can serve concurrent requests. `forward`
    is exactly `embed -> run_blocks -> head`; step caches call the stages themselves.

    Hooks for sequence parallelism, set from outside (vidloom.runtime.parallel.ulysses):
    `sequence` decides which tokens this rank keeps after `embed` and gathers them before
    `head`; `self_attentions()` are the layers whose attention must see every token (cross-
    attention queries only local tokens against the whole text, so it needs no exchange).
    """

    sequence: SequenceLayout = WHOLE_SEQUENCE
    """Token layout across ranks; the class default keeps every token here."""

    prompt_key_multiple: int | None = PADDING_KEY_MULTIPLE
    """prepare_prompt collapses the prompt's zero padding keys (layers.prompt_kv) to a key count rounded up to a
    multiple of this; None keeps all 512 (set at load: None under flash/sage, which take no mask, and --compile)."""

    KEEP_FP32: ClassVar[frozenset[str]] = frozenset(
        {"time_embed", "modulation", "out_modulation", "cross_norm"}
    )
    """Name segments of parameters to keep in float32 when the rest is cast to bf16/fp16
    (a parameter stays fp32 if any dotted segment of its name is listed), as the reference does."""

    def __init__(
        self,
        config: WanTransformerConfig,
        attention_fn: AttentionFn = attention,
        cross_attention_fn: AttentionFn | None = None,
    ) -> None:
        """`attention_fn` serves self-attention; `cross_attention_fn` (default: the same) the text cross-attention."""
        super().__init__()
        self.config = config
        dim = config.inner_dim
        self.patch_embed = nn.Conv3d(
            config.in_channels, dim, kernel_size=config.patch_size, stride=config.patch_size
        )
        self.time_embed = MLP(config.freq_dim, dim, dim, nn.SiLU())
        # One projection to the six per-block modulation vectors, shared by all blocks.
        self.time_modulation = nn.Linear(dim, 6 * dim)
        self.text_embed = MLP(config.text_dim, dim, dim, nn.GELU(approximate="tanh"))
        self.image_embed = (
            WanImageEmbed(config.image_dim, dim, config.pos_embed_seq_len) if config.image_dim is not None else None
        )
        self.blocks = nn.ModuleList(
            WanBlock(config, attention_fn, cross_attention_fn) for _ in range(config.num_layers)
        )
        # (shift, scale) applied after the final norm, offset by the raw time embedding.
        self.out_modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)
        self.proj_out = nn.Linear(dim, config.out_channels * math.prod(config.patch_size))

    def self_attentions(self) -> Iterator[WanAttention]:
        """The self-attention layers, in block order (each attends over the whole token sequence)."""
        return (block.self_attn for block in self.blocks)

    def forward(self, latents: Tensor, timestep: Tensor, text_embeds: Tensor | PromptKV,
                image_embeds: Tensor | PromptKV | None = None) -> Tensor:
        """latents [B, C_in, F, H, W], timestep [B] (or [B, S] per token), text_embeds [B, L, text_dim] or their
        prepare_prompt(...), image_embeds [B, I, image_dim] or their prepare_image(...) (I2V models)
        -> [B, C_out, F, H, W]."""
        x, cond = self.embed(latents, timestep, text_embeds, image_embeds)
        return self.head(self.run_blocks(x, cond), cond)

    def prepare_prompt(self, text_embeds: Tensor) -> PromptKV:
        """Every block's cross-attention keys/values of text_embeds [B, L, text_dim] (core.denoiser.PreparesPrompt):
        what embed's `text_embeds` takes instead, the same values it would project (under --shard-weights each
        block's weights gathered for it, layers.sharded), the zero padding rows collapsed (prompt_key_multiple)."""
        return prepare_prompt_kv([block.cross_attn for block in self.blocks], self.text_embed, text_embeds,
                                 key_multiple=self.prompt_key_multiple)

    def prepare_image(self, image_embeds: Tensor) -> PromptKV:
        """Every block's image keys/values of CLIP tokens [N, I, image_dim] (I2V models): what embed's `image_embeds`
        takes instead, the values it would project from them, computed in their dtype."""
        embed = lambda image: self._embed_image(image, image.dtype)  # noqa: E731
        return prepare_prompt_kv([b.cross_attn for b in self.blocks], embed, image_embeds, WanAttention.image_kv)

    def embed(self, latents: Tensor, timestep: Tensor, text_embeds: Tensor | PromptKV,
              image_embeds: Tensor | PromptKV | None = None) -> tuple[Tensor, WanConditioning]:
        """Stages 1-4: tokens [B, S, D] for the first block, and what every block reads.

        A [B, S] timestep gives every token its own timestep (Wan2.2 TI2V keeps the image frame at 0).
        """
        cfg = self.config
        batch, _, frames, height, width = latents.shape
        p_t, p_h, p_w = cfg.patch_size
        if frames % p_t or height % p_h or width % p_w:
            raise ValueError(
                f"latent (F, H, W)=({frames}, {height}, {width}) "
                f"is not divisible by patch_size {cfg.patch_size}"
            )
        grid = (frames // p_t, height // p_h, width // p_w)
        if max(grid) > cfg.rope_max_seq_len:
            raise ValueError(f"patch grid {grid} exceeds rope_max_seq_len={cfg.rope_max_seq_len}")
        if timestep.ndim == 0:
            timestep = timestep.expand(batch)

        # 1. Patchify: [B, C_in, F, H, W] -> [B, S, D], S = f*h*w, frames-major
        x = self.patch_embed(latents).flatten(2).transpose(1, 2).contiguous()

        # 2. Timestep: sinusoid [B(*S), freq_dim] (fp32) -> temb [B(, S), D] -> time_mod [B(, S), 6, D]
        freq = timestep_features(timestep.flatten(), cfg.freq_dim).to(self.time_embed.up.weight.dtype)
        if timestep.ndim == 2:
            freq = freq.unflatten(0, tuple(timestep.shape))
        temb = self.time_embed(freq).to(text_embeds.dtype)
        time_mod = self.time_modulation(F.silu(temb)).unflatten(-1, (6, -1))

        # 3. Text: [B, L, text_dim] -> [B, L, D]; image: [B, I, image_dim] -> [B, I', D] (prepared: keys/values)
        text = text_embeds if isinstance(text_embeds, PromptKV) else self.text_embed(text_embeds)
        image = self._embed_image(image_embeds, text.dtype)

        # 4. RoPE rotations [S, Dh/2], derived per call from the grid (no buffers, so meta-device init is safe)
        freqs = rope_freqs(grid, cfg.attention_head_dim, latents.device)

        # 5. This rank's tokens [B, S_local, D] and their RoPE rows (and per-token modulation rows)
        if time_mod.ndim == 4:
            x, (rope, rows) = self.sequence.shard(x, (freqs, time_mod.movedim(1, 0)))
            time_mod = rows.movedim(0, 1)
        else:
            x, (rope,) = self.sequence.shard(x, (freqs,))
        shape = tuple(latents.shape)
        return x, WanConditioning(text, temb, time_mod, rope, grid, shape, image)  # type: ignore[arg-type]

    def _embed_image(self, image_embeds: Tensor | PromptKV | None, dtype: torch.dtype) -> Tensor | PromptKV | None:
        if (image_embeds is None) != (self.image_embed is None):
            raise ValueError(
                "this transformer needs CLIP image embeddings" if image_embeds is None
                else "image embeddings given to a transformer without image cross-attention"
            )
        if image_embeds is None or self.image_embed is None or isinstance(image_embeds, PromptKV):
            return image_embeds
        return self.image_embed(image_embeds.to(dtype))

    def run_blocks(self, x: Tensor, cond: WanConditioning, start: int = 0, end: int | None = None) -> Tensor:
        """Stage 6: blocks[start:end] over tokens [B, S_local, D] -> [B, S_local, D]."""
        # islice, not a ModuleList slice: slicing builds a new ModuleList on every call.
        text, image = cond.text, cond.image
        mask = text.mask() if isinstance(text, PromptKV) else None
        for index, block in enumerate(itertools.islice(self.blocks, start, end), start):
            x = block(x, text.block(index) if isinstance(text, PromptKV) else text, cond.time_mod, cond.rope,
                      image.block(index) if isinstance(image, PromptKV) else image, mask)
        return x

    def block_input(self, x: Tensor, cond: WanConditioning, index: int = 0) -> Tensor:
        """The timestep-modulated tokens [B, S, D] block `index` feeds to self-attention, given its input x."""
        return self.blocks[index].attention_input(x, cond.time_mod)

    def head(self, x: Tensor, cond: WanConditioning) -> Tensor:
        """Stages 7-9: tokens [B, S_local, D] after the last block -> prediction [B, C_out, F, H, W]."""
        cfg = self.config
        p_t, p_h, p_w = cfg.patch_size
        batch, _, frames, height, width = cond.latent_shape

        # 7. Every rank's tokens, in order: [B, S_local, D] -> [B, S, D]
        x = self.sequence.gather(x)

        # 8. Output modulation + projection: [B, S, D] -> [B, S, p_t*p_h*p_w*C_out]
        if cond.temb.ndim == 3:  # per-token: [B, S, D] -> 2 x [B, S, D]
            shift, scale = (self.out_modulation.unsqueeze(0) + cond.temb.unsqueeze(2)).unbind(2)
        else:
            shift, scale = (self.out_modulation + cond.temb.unsqueeze(1)).chunk(2, dim=1)  # 2 x [B, 1, D]
        x = self.proj_out(modulate(x, shift, scale, cfg.eps))

        # 9. Unpatchify: [B, f, h, w, p_t, p_h, p_w, C_out] -> [B, C_out, F, H, W]
        x = x.reshape(batch, *cond.grid, p_t, p_h, p_w, cfg.out_channels)
        x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(batch, cfg.out_channels, frames, height, width)
