"""Flux2's blocks: the timestep embedding, the SwiGLU MLP, double-stream and single-stream blocks.

Every block reads and returns the float32 joint stream [B, L + N, dim] (text first) and runs its
linears and attention in the compute dtype `dtype` (float32, or bf16 under the cast); see ops.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn
from vidloom.families.flux2.ops import gated_add, norm_modulate, qk_norm_rope, swiglu
from vidloom.layers.timestep import timestep_features


class TimeEmbedding(nn.Module):
    def __init__(self, channels: int, dim: int) -> None:
        super().__init__()
        self.channels = channels
        self.up = nn.Linear(channels, dim, bias=False)
        self.down = nn.Linear(dim, dim, bias=False)

    def forward(self, t: Tensor) -> Tensor:
        """t [B] (x1000, float32) -> [B, dim] in this module's dtype (float32 when kept as an island)."""
        features = timestep_features(t, self.channels).to(self.up.weight.dtype)
        return self.down(F.silu(self.up(features)))


class GatedMLP(nn.Module):
    """SwiGLU feed-forward whose gate and value share the input projection."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden * 2, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(swiglu(self.up(x)))


def _heads(x: Tensor, head_dim: int) -> Tensor:
    return x.unflatten(-1, (-1, head_dim))


class DoubleStreamBlock(nn.Module):
    """Image and text tokens with their own weights, attending jointly (text first)."""

    def __init__(self, dim: int, head_dim: int, mlp_dim: int, eps: float, attention_fn: AttentionFn) -> None:
        super().__init__()
        self.head_dim, self.eps, self.attention_fn = head_dim, eps, attention_fn
        self.num_heads = dim // head_dim
        for side in ("img", "txt"):
            for name in ("q", "k", "v", "out"):
                setattr(self, f"{side}_{name}", nn.Linear(dim, dim, bias=False))
            setattr(self, f"{side}_norm_q", nn.RMSNorm(head_dim, eps=eps))
            setattr(self, f"{side}_norm_k", nn.RMSNorm(head_dim, eps=eps))
            setattr(self, f"{side}_mlp", GatedMLP(dim, mlp_dim))

    def _qk(self, side: str, x: Tensor, freqs: Tensor, q: Tensor, k: Tensor) -> None:
        """One side's normalized, rotated q and k, written into its rows of the joint q and k."""
        qk_norm_rope(_heads(getattr(self, f"{side}_q")(x), self.head_dim), getattr(self, f"{side}_norm_q"), freqs, q)
        qk_norm_rope(_heads(getattr(self, f"{side}_k")(x), self.head_dim), getattr(self, f"{side}_norm_k"), freqs, k)

    def forward(
        self, h: Tensor, text_tokens: int, mod_img: Tensor, mod_txt: Tensor, freqs: Tensor, dtype: torch.dtype,
        key_mask: Tensor | None = None,
    ) -> Tensor:
        """h [B, L + N, dim] float32, mod_* [B, 1, 6 * dim] = (shift, scale, gate) for attention, then for
        the MLP; freqs [L + N, head_dim // 2]; key_mask: a padded shard's (layers.sequence.JointPart) -> the next h."""
        length, eps = text_tokens, self.eps
        txt, img = h[:, :length], h[:, length:]
        i_shift, i_scale, i_gate, i_shift2, i_scale2, i_gate2 = mod_img.chunk(6, dim=-1)
        t_shift, t_scale, t_gate, t_shift2, t_scale2, t_gate2 = mod_txt.chunk(6, dim=-1)
        img_in = norm_modulate(img, i_shift, i_scale, eps, dtype)
        txt_in = norm_modulate(txt, t_shift, t_scale, eps, dtype)

        # Joint q and k are filled in place (no concatenation): text rows, then image rows.
        heads = (h.shape[-1] // self.head_dim, self.head_dim)
        q, k = (torch.empty((*h.shape[:2], *heads), dtype=dtype, device=h.device) for _ in range(2))
        self._qk("txt", txt_in, freqs[:length], q[:, :length], k[:, :length])
        self._qk("img", img_in, freqs[length:], q[:, length:], k[:, length:])
        v = _heads(torch.cat([self.txt_v(txt_in), self.img_v(img_in)], dim=1), self.head_dim)
        joint = self.attention_fn(q, k, v, key_mask).flatten(2, 3)
        txt_attn, img_attn = joint.split([length, h.shape[1] - length], dim=1)

        # Each side's last residual add lands in its rows of the next joint stream.
        out = torch.empty_like(h)
        img = gated_add(img, i_gate, self.img_out(img_attn))
        gated_add(img, i_gate2, self.img_mlp(norm_modulate(img, i_shift2, i_scale2, eps, dtype)), out[:, length:])
        txt = gated_add(txt, t_gate, self.txt_out(txt_attn))
        gated_add(txt, t_gate2, self.txt_mlp(norm_modulate(txt, t_shift2, t_scale2, eps, dtype)), out[:, :length])
        return out


class SingleStreamBlock(nn.Module):
    """One token stream; attention and MLP run in parallel off one fused input projection."""

    def __init__(self, dim: int, head_dim: int, mlp_dim: int, eps: float, attention_fn: AttentionFn) -> None:
        super().__init__()
        self.head_dim, self.eps, self.attention_fn = head_dim, eps, attention_fn
        self.dim, self.mlp_dim, self.num_heads = dim, mlp_dim, dim // head_dim
        self.qkv_mlp = nn.Linear(dim, 3 * dim + 2 * mlp_dim, bias=False)
        self.norm_q = nn.RMSNorm(head_dim, eps=eps)
        self.norm_k = nn.RMSNorm(head_dim, eps=eps)
        self.out = nn.Linear(dim + mlp_dim, dim, bias=False)

    def forward(self, x: Tensor, mod: Tensor, freqs: Tensor, dtype: torch.dtype,
                key_mask: Tensor | None = None) -> Tensor:
        """x [B, S, dim] float32, mod [B, 1, 3 * dim] = (shift, scale, gate), freqs [S, head_dim // 2]."""
        shift, scale, gate = mod.chunk(3, dim=-1)
        qkv, mlp = self.qkv_mlp(norm_modulate(x, shift, scale, self.eps, dtype)).split(
            [3 * self.dim, 2 * self.mlp_dim], dim=-1)
        q, k, v = (_heads(part, self.head_dim) for part in qkv.chunk(3, dim=-1))
        q = qk_norm_rope(q, self.norm_q, freqs, torch.empty(q.shape, dtype=dtype, device=x.device))
        k = qk_norm_rope(k, self.norm_k, freqs, torch.empty(k.shape, dtype=dtype, device=x.device))
        # The out projection reads [attention, swiglu(mlp)]: both are written into one buffer (no concatenation).
        joined = torch.empty((*x.shape[:2], self.dim + self.mlp_dim), dtype=dtype, device=x.device)
        joined[..., : self.dim].unflatten(-1, q.shape[-2:]).copy_(self.attention_fn(q, k, v, key_mask))
        swiglu(mlp, out=joined[..., self.dim :])
        return gated_add(x, gate, self.out(joined))
