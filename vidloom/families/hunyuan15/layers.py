"""HunyuanVideo-1.5's transformer pieces: timestep MLP, condition projections, the text token refiner, the rotary
layout of video tokens and the dual-stream block.

Blocks read and return float32 streams; linears and attention run in the compute dtype `dtype`, norms, modulation
and residual adds in float32. In float32 they compute what diffusers' HunyuanVideo15 modules compute (the rotary
layout and the masked pooling follow the reference step by step; fused roundings move results by about an ulp).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn
from vidloom.layers.fused_linear import linear_gelu_tanh
from vidloom.layers.rms_norm import RMSNorm
from vidloom.layers.timestep import timestep_features

TIMESTEP_CHANNELS = 256  # the sinusoid width of every timestep MLP (timesteps arrive in [0, 1000])
EPS = 1e-6  # the blocks' layer and RMS norms; the projections' LayerNorms keep torch's 1e-5


class TimestepMLP(nn.Module):
    """Sinusoid -> Linear -> SiLU -> Linear (also the pooled-text MLP when `in_dim` is given)."""

    def __init__(self, dim: int, in_dim: int = TIMESTEP_CHANNELS) -> None:
        super().__init__()
        self.up = nn.Linear(in_dim, dim)
        self.down = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.up(x)))

    def embed_time(self, t: Tensor) -> Tensor:
        """t [B] (0..1000) -> [B, dim]."""
        return self(timestep_features(t, TIMESTEP_CHANNELS).to(self.up.weight.dtype))


class GlyphProjection(nn.Module):
    """ByT5 glyph states -> model width: LayerNorm, three linears with exact GELUs between."""

    def __init__(self, in_dim: int, hidden: int, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(in_dim)
        self.up, self.mid, self.down = nn.Linear(in_dim, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.mid(F.gelu(self.up(self.norm(x))))))


class ImageProjection(nn.Module):
    """SigLIP image states -> model width: LayerNorm, Linear, GELU, Linear, LayerNorm."""

    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__()
        self.norm_in = nn.LayerNorm(in_dim)
        self.up = nn.Linear(in_dim, in_dim)
        self.down = nn.Linear(in_dim, dim)
        self.norm_out = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm_out(self.down(F.gelu(self.up(self.norm_in(x)))))


class MLP(nn.Module):
    """Linear -> activation -> Linear, `ratio` times wider inside; the blocks' tanh-GELU up-projection runs as one
    oneDNN GEMM with its GELU in float32 CPU inference (layers.fused_linear), the refiner's SiLU one as two calls."""

    def __init__(self, dim: int, ratio: float, tanh_gelu: bool) -> None:
        super().__init__()
        self.tanh_gelu = tanh_gelu
        self.up = nn.Linear(dim, int(dim * ratio))
        self.down = nn.Linear(int(dim * ratio), dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(linear_gelu_tanh(self.up, x) if self.tanh_gelu else F.silu(self.up(x)))


class RefinerBlock(nn.Module):
    """Self-attention + SiLU MLP over text tokens, each gated by the timestep-and-pooled-text embedding."""

    def __init__(self, dim: int, heads: int, attention_fn: AttentionFn) -> None:
        super().__init__()
        self.heads, self.attention_fn = heads, attention_fn
        self.norm1 = nn.LayerNorm(dim, eps=EPS)
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.norm2 = nn.LayerNorm(dim, eps=EPS)
        self.mlp = MLP(dim, 4.0, tanh_gelu=False)
        self.gates = nn.Linear(dim, 2 * dim)

    def forward(self, x: Tensor, cond: Tensor, mask: Tensor | None) -> Tensor:
        n = self.norm1(x)
        q, k, v = (proj(n).unflatten(-1, (self.heads, -1)) for proj in (self.q, self.k, self.v))
        attn = self.out(self.attention_fn(q, k, v, mask).flatten(2))
        gate_attn, gate_mlp = self.gates(F.silu(cond))[:, None].chunk(2, dim=-1)
        x = x + attn * gate_attn
        return x + self.mlp(self.norm2(x)) * gate_mlp


class TokenRefiner(nn.Module):
    """The text encoder's states -> model width, refined by a few self-attention blocks conditioned on the timestep
    and the masked mean of the input tokens."""

    def __init__(self, in_dim: int, dim: int, heads: int, depth: int, attention_fn: AttentionFn) -> None:
        super().__init__()
        self.time = TimestepMLP(dim)
        self.pooled = TimestepMLP(dim, in_dim)
        self.proj_in = nn.Linear(in_dim, dim)
        self.blocks = nn.ModuleList(RefinerBlock(dim, heads, attention_fn) for _ in range(depth))

    def forward(self, text: Tensor, timestep: Tensor, valid: Tensor, padded: bool) -> Tensor:
        """text [B, L, in_dim], timestep [B], valid [B, L] bool, padded: whether any row is invalid (known on the
        host: no device read) -> [B, L, dim] (padded rows hold garbage)."""
        weights = valid.float().unsqueeze(-1)
        pooled = ((text * weights).sum(dim=1) / weights.sum(dim=1)).to(text.dtype)
        cond = self.time.embed_time(timestep) + self.pooled(pooled)
        x, mask = self.proj_in(text), valid[:, None, None, :] if padded else None
        for block in self.blocks:
            x = block(x, cond, mask)
        return x


def video_rotations(grid: tuple[int, int, int], axes: tuple[int, ...], theta: float,
                    device: torch.device) -> tuple[Tensor, Tensor]:
    """cos, sin [F * H * W, head_dim] of the token grid (frame, height, width), row-major; each axis owns
    `axes[i]` channels, each frequency repeated for the two channels of its pair (the reference's float32 layout)."""
    positions = torch.meshgrid(*(torch.arange(n, device=device, dtype=torch.float32) for n in grid), indexing="ij")
    cos, sin = [], []
    for pos, dim in zip(positions, axes):
        inverse = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
        angles = torch.outer(pos.reshape(-1), inverse)
        cos.append(angles.cos().repeat_interleave(2, dim=1))
        sin.append(angles.sin().repeat_interleave(2, dim=1))
    return torch.cat(cos, dim=1), torch.cat(sin, dim=1)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, N, H, D] rotated pairwise (channels 2j, 2j + 1) by cos/sin [N, D]; in float32, back to x's dtype."""
    pairs = x.float().unflatten(-1, (-1, 2))
    swapped = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return (x.float() * cos[:, None] + swapped * sin[:, None]).to(x.dtype)


class StreamSide(nn.Module):
    """One stream's weights in a dual-stream block: modulation, q/k/v/out projections, q/k RMS norms, MLP."""

    def __init__(self, dim: int, head_dim: int, mlp_ratio: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.mod = nn.Linear(dim, 6 * dim)
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q = RMSNorm(head_dim, eps=EPS)
        self.norm_k = RMSNorm(head_dim, eps=EPS)
        self.mlp = MLP(dim, mlp_ratio, tanh_gelu=True)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q = self.norm_q(self.q(x).unflatten(-1, (-1, self.head_dim)))
        k = self.norm_k(self.k(x).unflatten(-1, (-1, self.head_dim)))
        return q, k, self.v(x).unflatten(-1, (-1, self.head_dim))


def norm_shift_scale(x: Tensor, shift: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """Affine-free LayerNorm of the float32 stream, then x * (1 + scale) + shift, in `dtype`."""
    return (F.layer_norm(x, x.shape[-1:], eps=EPS) * (1 + scale) + shift).to(dtype)


class DualStreamBlock(nn.Module):
    """Video and condition tokens with their own weights, attending jointly ([video, condition])."""

    def __init__(self, dim: int, head_dim: int, mlp_ratio: float, attention_fn: AttentionFn) -> None:
        super().__init__()
        self.attention_fn = attention_fn
        self.num_heads = dim // head_dim  # what sequence parallel splits
        self.video = StreamSide(dim, head_dim, mlp_ratio)
        self.cond = StreamSide(dim, head_dim, mlp_ratio)

    def attention_input(self, h: Tensor, video_tokens: int, temb: Tensor, dtype: torch.dtype) -> Tensor:
        """The modulated video tokens attention reads (TeaCache's change indicator)."""
        shift, scale = self.video.mod(F.silu(temb))[:, None].float().chunk(6, dim=-1)[:2]
        return norm_shift_scale(h[:, :video_tokens], shift, scale, dtype)

    def forward(self, h: Tensor, video_tokens: int, temb: Tensor, mask: Tensor | None,
                rotations: tuple[Tensor, Tensor], dtype: torch.dtype) -> Tensor:
        """h [B, N + L, dim]: the float32 joint stream [video (N), condition (L)], temb [B, dim], mask: valid keys
        over the joint stream or None -> the next h."""
        x, c = h[:, :video_tokens], h[:, video_tokens:]
        silu = F.silu(temb)
        v_shift, v_scale, v_gate, v_shift2, v_scale2, v_gate2 = self.video.mod(silu)[:, None].float().chunk(6, -1)
        c_shift, c_scale, c_gate, c_shift2, c_scale2, c_gate2 = self.cond.mod(silu)[:, None].float().chunk(6, -1)
        vq, vk, vv = self.video.qkv(norm_shift_scale(x, v_shift, v_scale, dtype))
        cq, ck, cv = self.cond.qkv(norm_shift_scale(c, c_shift, c_scale, dtype))
        vq, vk = rotate(vq, *rotations), rotate(vk, *rotations)
        joint = self.attention_fn(torch.cat([vq, cq], 1), torch.cat([vk, ck], 1), torch.cat([vv, cv], 1), mask)
        v_attn, c_attn = joint.flatten(2).split([video_tokens, c.shape[1]], dim=1)
        x = x + self.video.out(v_attn).float() * v_gate
        c = c + self.cond.out(c_attn).float() * c_gate
        x = x + v_gate2 * self.video.mlp(norm_shift_scale(x, v_shift2, v_scale2, dtype)).float()
        c = c + c_gate2 * self.cond.mlp(norm_shift_scale(c, c_shift2, c_scale2, dtype)).float()
        return torch.cat([x, c], dim=1)
