"""Qwen-Image's pieces: the timestep embedding, the GELU MLP and the dual-stream (MMDiT) block.

Blocks read and return the float32 joint stream [B, L + N, dim] (text first); linears and attention run in the
compute dtype `dtype`, layer norms, modulation and residual adds in float32. In float32 they compute what
diffusers' QwenImageTransformerBlock computes (fused roundings move results by about one ulp).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn
from vidloom.layers.fused_linear import linear_gelu_tanh
from vidloom.layers.rms_norm import RMSNorm
from vidloom.layers.timestep import timestep_features
from vidloom.families.qwen_image.rope import apply_rotations

TIMESTEP_CHANNELS = 256  # QwenTimestepProjEmbeddings' sinusoid width
TIMESTEP_SCALE = 1000.0  # its Timesteps(scale=1000): timesteps arrive in [0, 1]


class TimeEmbedding(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(TIMESTEP_CHANNELS, dim)
        self.down = nn.Linear(dim, dim)

    def forward(self, t: Tensor) -> Tensor:
        """t [B] in [0, 1] -> [B, dim] in this module's dtype."""
        features = timestep_features(t, TIMESTEP_CHANNELS, scale=TIMESTEP_SCALE).to(self.up.weight.dtype)
        return self.down(F.silu(self.up(features)))


class GeluMLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(linear_gelu_tanh(self.up, x))  # one oneDNN GEMM with its GELU on float32 CPU


def norm_modulate(x: Tensor, shift: Tensor, scale: Tensor, eps: float, dtype: torch.dtype) -> Tensor:
    """LayerNorm (no affine) of the float32 stream x [B, S, dim], then x * (1 + scale) + shift, in `dtype`.

    One modulation for every row (shift and scale [1, 1, dim]: one sample, or one per-row-free batch) is exactly a
    LayerNorm affine, so the kernel applies it in its own pass (one pass over x instead of three; float32 ulps from
    the reference's order); per-sample or per-row modulations take the broadcast form."""
    if shift.shape[:-1].numel() == 1 and scale.shape[:-1].numel() == 1:
        return F.layer_norm(x, x.shape[-1:], (1 + scale).reshape(-1), shift.reshape(-1), eps=eps).to(dtype)
    return torch.addcmul(shift, F.layer_norm(x, x.shape[-1:], eps=eps), 1 + scale).to(dtype)


@dataclass(frozen=True)
class ImageModulation:
    """What modulates the image stream: silu of the timestep embedding [B, dim]; under zero_cond_t with references
    also silu of the timestep-0 embedding [B, dim] and the image rows ([N] bool) that take it (references' tokens)."""

    silu_temb: Tensor
    silu_zero: Tensor | None = None
    zero_rows: Tensor | None = None

    def chunks(self, mod: nn.Linear) -> tuple[Tensor, ...]:
        """`mod`'s six modulations (shift, scale, gate; then the MLP's), [B, 1, dim] each, or chosen per image row
        [B, N, dim] when some rows take timestep 0."""
        chunks = mod(self.silu_temb)[:, None].float().chunk(6, dim=-1)
        if self.zero_rows is None:
            return chunks
        rows = self.zero_rows[:, None]
        return tuple(torch.where(rows, zero, t)
                     for zero, t in zip(mod(self.silu_zero)[:, None].float().chunk(6, dim=-1), chunks))


class StreamSide(nn.Module):
    """One stream's weights in a dual-stream block: its modulation, q/k/v/out projections, q/k norms, MLP."""

    def __init__(self, dim: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.mod = nn.Linear(dim, 6 * dim)
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q = RMSNorm(head_dim, eps=eps)
        self.norm_k = RMSNorm(head_dim, eps=eps)
        self.mlp = GeluMLP(dim)

    def qkv(self, x: Tensor, rotations: Tensor, head_dim: int, queries: bool = True
            ) -> tuple[Tensor | None, Tensor, Tensor]:
        """Normalized, rotated q and k and plain v, [B, S, H, head_dim] each (q None where `queries` is False)."""
        q = apply_rotations(self.norm_q(self.q(x).unflatten(-1, (-1, head_dim))), rotations) if queries else None
        k = apply_rotations(self.norm_k(self.k(x).unflatten(-1, (-1, head_dim))), rotations)
        return q, k, self.v(x).unflatten(-1, (-1, head_dim))


class DualStreamBlock(nn.Module):
    """Image and text tokens with their own weights, attending jointly (text first)."""

    def __init__(self, dim: int, head_dim: int, eps: float, attention_fn: AttentionFn) -> None:
        super().__init__()
        self.head_dim, self.eps, self.attention_fn = head_dim, eps, attention_fn
        self.num_heads = dim // head_dim
        self.img = StreamSide(dim, head_dim, eps)
        self.txt = StreamSide(dim, head_dim, eps)

    def modulations(self, image: ImageModulation) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        """(image, text) modulations: (shift, scale, gate) for attention, then for the MLP, [B, 1, dim] each (the
        image side's [B, N, dim] where rows take timestep 0)."""
        return image.chunks(self.img.mod), self.txt.mod(image.silu_temb)[:, None].float().chunk(6, dim=-1)

    def attention_input(self, h: Tensor, text_tokens: int, image: ImageModulation, dtype: torch.dtype) -> Tensor:
        """The modulated tokens attention reads, [text, image] (TeaCache's indicator)."""
        mod_img, mod_txt = self.modulations(image)
        return torch.cat([norm_modulate(h[:, :text_tokens], *mod_txt[:2], self.eps, dtype),
                          norm_modulate(h[:, text_tokens:], *mod_img[:2], self.eps, dtype)], dim=1)

    def forward(self, h: Tensor, text_tokens: int, image: ImageModulation, rotations: Tensor, dtype: torch.dtype,
                key_mask: Tensor | None = None, text_out: bool = True) -> Tensor:
        """h [B, L + N, dim] float32, image: the timestep conditioning, rotations [L + N, head_dim // 2], key_mask:
        a padded shard's (layers.sequence.JointPart) -> the next h.

        text_out=False (the model's last block, whose text rows nothing reads: the head keeps the image rows) skips
        the text side's queries, output projection and MLP and passes the text rows through as they came in."""
        length, eps = text_tokens, self.eps
        txt, img = h[:, :length], h[:, length:]
        mod_img, mod_txt = self.modulations(image)
        i_shift, i_scale, i_gate, i_shift2, i_scale2, i_gate2 = mod_img
        t_shift, t_scale, t_gate, t_shift2, t_scale2, t_gate2 = mod_txt

        # 1. Joint attention over [text, image]: each side projects, normalizes and rotates its own tokens.
        tq, tk, tv = self.txt.qkv(norm_modulate(txt, t_shift, t_scale, eps, dtype), rotations[:length], self.head_dim,
                                  queries=text_out)
        iq, ik, iv = self.img.qkv(norm_modulate(img, i_shift, i_scale, eps, dtype), rotations[length:], self.head_dim)
        queries = torch.cat([tq, iq], 1) if text_out else iq
        joint = self.attention_fn(queries, torch.cat([tk, ik], 1), torch.cat([tv, iv], 1), key_mask).flatten(2, 3)
        out = torch.empty_like(h)  # the next stream, written in place of a final cat of its two sides
        img = torch.addcmul(img, i_gate, self.img.out(joint[:, joint.shape[1] - img.shape[1]:]).float())

        # 2. Each side's MLP (the gated residual adds as one addcmul pass).
        torch.addcmul(img, i_gate2, self.img.mlp(norm_modulate(img, i_shift2, i_scale2, eps, dtype)).float(),
                      out=out[:, length:])
        if not text_out:
            out[:, :length] = txt
            return out
        txt = torch.addcmul(txt, t_gate, self.txt.out(joint[:, :length]).float())
        torch.addcmul(txt, t_gate2, self.txt.mlp(norm_modulate(txt, t_shift2, t_scale2, eps, dtype)).float(),
                      out=out[:, :length])
        return out
