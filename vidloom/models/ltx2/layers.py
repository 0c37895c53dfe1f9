"""Pieces shared by the LTX-2 transformer and its text connectors: attention, feed-forward, AdaLN timestep."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn, attention
from vidloom.layers.fused_linear import linear_gelu_tanh
from vidloom.models.ltx2.rope import RopeTables, apply_rope
from vidloom.layers.timestep import timestep_features

TIMESTEP_CHANNELS = 256  # sinusoidal features before the timestep MLP (PixArt-alpha's AdaLN-single)


def rms_norm(x: Tensor, eps: float, weight: Tensor | None = None) -> Tensor:
    """RMS norm computed in float32, back in x's dtype (diffusers' RMSNorm order of operations)."""
    if weight is None:  # torch's fused kernel: float32 inside, one rounding to x's dtype, as the steps below
        return F.rms_norm(x, (x.shape[-1],), eps=eps)
    variance = x.float().pow(2).mean(-1, keepdim=True)
    out = x * torch.rsqrt(variance + eps)
    if weight is not None:
        return out.to(weight.dtype) * weight if weight.dtype in (torch.float16, torch.bfloat16) else out * weight
    return out.to(x.dtype)


class Norm(nn.Module):
    """RMS norm with an optional learned scale (`norm_elementwise_affine`)."""

    def __init__(self, dim: int, eps: float, affine: bool) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.eps, self.weight)


class FeedForward(nn.Module):
    """Linear -> tanh-GELU -> Linear, 4x wide."""

    def __init__(self, dim: int, bias: bool = True) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim, bias=bias)
        self.down = nn.Linear(4 * dim, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(linear_gelu_tanh(self.up, x))


class CaptionProjection(nn.Sequential):
    """Caption tokens -> stream width: Linear -> tanh-GELU -> Linear. A Sequential so the loaded names stay `.0` and
    `.2`; the first linear and its GELU run as one oneDNN GEMM in float32 CPU inference (layers.fused_linear)."""

    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__(nn.Linear(in_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self[2](linear_gelu_tanh(self[0], x))


class Attention(nn.Module):
    """Multi-head attention with RMS-normed q/k across heads, optional rotary tables on q and k
    (separately: audio<->video attention rotates each side by its own positions) and optional
    per-head output gates (2 * sigmoid of a projection of the query input)."""

    def __init__(
        self, query_dim: int, heads: int, head_dim: int, *, kv_dim: int | None = None, bias: bool = True,
        out_bias: bool = True, gated: bool = False, rope_layout: str = "interleaved",
        attention_fn: AttentionFn = attention,
    ) -> None:
        super().__init__()
        inner, kv_dim = heads * head_dim, kv_dim or query_dim
        self.heads, self.rope_layout, self.attention_fn = heads, rope_layout, attention_fn
        self.to_q = nn.Linear(query_dim, inner, bias=bias)
        self.to_k = nn.Linear(kv_dim, inner, bias=bias)
        self.to_v = nn.Linear(kv_dim, inner, bias=bias)
        self.norm_q = nn.RMSNorm(inner, eps=1e-6)
        self.norm_k = nn.RMSNorm(inner, eps=1e-6)
        self.out = nn.Linear(inner, query_dim, bias=out_bias)
        self.gate = nn.Linear(query_dim, heads, bias=True) if gated else None

    @property
    def num_heads(self) -> int:
        """What sequence parallel splits (runtime.parallel.ulysses.apply_sp)."""
        return self.heads

    def context_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """The keys (RMS-normed) and values of `context` [B, L, kv_dim], split into heads [B, L, H, D] and laid
        out [B, H, L, D] in memory (SDPA's own layout, so it reads them without a stride per head): what
        forward's `kv` takes, so a context that does not change between calls (a request's text) is projected
        once."""
        heads = lambda t: t.unflatten(2, (self.heads, -1)).transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
        return heads(self.norm_k(self.to_k(context))), heads(self.to_v(context))

    def forward(
        self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None,
        q_rope: RopeTables | None = None, k_rope: RopeTables | None = None, skip: bool = False,
        kv: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """`skip`: spatio-temporal guidance's perturbation, the values pass through unattended.
        `kv`: context_kv(context) computed earlier (context is then not read; not with rotary tables)."""
        split = lambda t: t.unflatten(2, (self.heads, -1))  # noqa: E731
        if kv is not None:
            if q_rope is not None or skip:
                raise ValueError("precomputed keys/values are for unrotated, unperturbed attention (text)")
            q = self.norm_q(self.to_q(x))
            out = self.attention_fn(split(q), kv[0], kv[1], mask).flatten(2, 3).to(q.dtype)
        else:
            context = x if context is None else context
            v = self.to_v(context)
            if skip:
                out = v
            else:
                q, k = self.norm_q(self.to_q(x)), self.norm_k(self.to_k(context))
                if q_rope is not None:
                    q = apply_rope(q, q_rope, self.rope_layout)
                    k = apply_rope(k, k_rope if k_rope is not None else q_rope, self.rope_layout)
                out = self.attention_fn(split(q), split(k), split(v), mask).flatten(2, 3).to(q.dtype)
        if self.gate is not None:
            gates = 2.0 * torch.sigmoid(self.gate(x))  # [B, S, H]; zero logits leave the output as is
            out = (out.unflatten(2, (self.heads, -1)) * gates.unsqueeze(-1)).flatten(2, 3)
        return self.out(out)


class TimestepModulation(nn.Module):
    """AdaLN-single: timestep -> sinusoid -> MLP (the embedding) -> SiLU -> Linear (`count` vectors)."""

    def __init__(self, dim: int, count: int) -> None:
        super().__init__()
        self.up = nn.Linear(TIMESTEP_CHANNELS, dim)
        self.down = nn.Linear(dim, dim)
        self.mod = nn.Linear(dim, count * dim)

    def forward(self, timestep: Tensor, batch: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """timestep [B] or [B, T] -> (modulation [B, T, count * dim], embedding [B, T, dim])."""
        features = timestep_features(timestep.flatten(), TIMESTEP_CHANNELS).to(dtype)
        embedded = self.down(F.silu(self.up(features)))
        mod = self.mod(F.silu(embedded))
        return mod.view(batch, -1, mod.shape[-1]), embedded.view(batch, -1, embedded.shape[-1])


def modulation(table: Tensor, temb: Tensor, batch: int) -> tuple[Tensor, ...]:
    """Per-layer table [k, D] + global modulation [B, T, k * D] -> k tensors [B, T, D]."""
    values = table[None, None].to(temb.device) + temb.reshape(batch, temb.shape[1], table.shape[0], -1)
    return values.unbind(dim=2)
