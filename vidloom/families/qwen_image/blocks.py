"""Qwen-Image's pieces: the timestep embedding, the GELU MLP and the dual-stream (MMDiT) block.

Blocks read and return the float32 joint stream [B, L + N, dim] (text first); linears and attention run in the
compute dtype `dtype`, layer norms, modulation and residual adds in float32. In float32 they compute what
diffusers' QwenImageTransformerBlock computes (fused roundings move results by about one ulp).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn
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
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def norm_modulate(x: Tensor, shift: Tensor, scale: Tensor, eps: float, dtype: torch.dtype) -> Tensor:
    """LayerNorm (no affine) of the float32 stream x [B, S, dim], then x * (1 + scale) + shift, in `dtype`."""
    return (F.layer_norm(x, x.shape[-1:], eps=eps) * (1 + scale) + shift).to(dtype)


class StreamSide(nn.Module):
    """One stream's weights in a dual-stream block: its modulation, q/k/v/out projections, q/k norms, MLP."""

    def __init__(self, dim: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.mod = nn.Linear(dim, 6 * dim)
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q = RMSNorm(head_dim, eps=eps)
        self.norm_k = RMSNorm(head_dim, eps=eps)
        self.mlp = GeluMLP(dim)

    def qkv(self, x: Tensor, rotations: Tensor, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
        """Normalized, rotated q and k and plain v, [B, S, H, head_dim] each."""
        q = apply_rotations(self.norm_q(self.q(x).unflatten(-1, (-1, head_dim))), rotations)
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

    def modulations(self, silu_temb: Tensor) -> tuple[Tensor, Tensor]:
        """(image, text) modulations [B, 1, 6 * dim] = (shift, scale, gate) for attention, then for the MLP."""
        return self.img.mod(silu_temb)[:, None].float(), self.txt.mod(silu_temb)[:, None].float()

    def attention_input(self, h: Tensor, text_tokens: int, silu_temb: Tensor, dtype: torch.dtype) -> Tensor:
        """The modulated tokens attention reads, [text, image] (TeaCache's indicator)."""
        mod_img, mod_txt = self.modulations(silu_temb)
        i_shift, i_scale = mod_img.chunk(6, dim=-1)[:2]
        t_shift, t_scale = mod_txt.chunk(6, dim=-1)[:2]
        return torch.cat([norm_modulate(h[:, :text_tokens], t_shift, t_scale, self.eps, dtype),
                          norm_modulate(h[:, text_tokens:], i_shift, i_scale, self.eps, dtype)], dim=1)

    def forward(self, h: Tensor, text_tokens: int, silu_temb: Tensor, rotations: Tensor, dtype: torch.dtype,
                key_mask: Tensor | None = None) -> Tensor:
        """h [B, L + N, dim] float32, silu_temb [B, dim], rotations [L + N, head_dim // 2], key_mask: a padded
        shard's (layers.sequence.JointPart) -> the next h."""
        length, eps = text_tokens, self.eps
        txt, img = h[:, :length], h[:, length:]
        mod_img, mod_txt = self.modulations(silu_temb)
        i_shift, i_scale, i_gate, i_shift2, i_scale2, i_gate2 = mod_img.chunk(6, dim=-1)
        t_shift, t_scale, t_gate, t_shift2, t_scale2, t_gate2 = mod_txt.chunk(6, dim=-1)

        # 1. Joint attention over [text, image]: each side projects, normalizes and rotates its own tokens.
        tq, tk, tv = self.txt.qkv(norm_modulate(txt, t_shift, t_scale, eps, dtype), rotations[:length], self.head_dim)
        iq, ik, iv = self.img.qkv(norm_modulate(img, i_shift, i_scale, eps, dtype), rotations[length:], self.head_dim)
        joint = self.attention_fn(torch.cat([tq, iq], 1), torch.cat([tk, ik], 1), torch.cat([tv, iv], 1), key_mask)
        txt_attn, img_attn = joint.flatten(2, 3).split([length, h.shape[1] - length], dim=1)
        img = img + i_gate * self.img.out(img_attn).float()
        txt = txt + t_gate * self.txt.out(txt_attn).float()

        # 2. Each side's MLP.
        img = img + i_gate2 * self.img.mlp(norm_modulate(img, i_shift2, i_scale2, eps, dtype)).float()
        txt = txt + t_gate2 * self.txt.mlp(norm_modulate(txt, t_shift2, t_scale2, eps, dtype)).float()
        return torch.cat([txt, img], dim=1)
