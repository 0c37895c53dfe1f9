"""SANA-WM attention: dual-branch (main + camera) self-attention, GDN or softmax, and text cross-attention.

Every self-attention block runs two branches over the same tokens and sums them before one shared output
gate and projection: the main branch (RoPE positions) and the camera branch (UCPE per-ray transforms, see
rays.py). GDN blocks run the bidirectional delta rule (delta_rule.py); every `softmax_every_n`-th block runs
full softmax attention instead, with the same parameters. The numerics follow diffusers'
BidirectionalGDNUCPESinglePathLiteLA / _SoftmaxUCPESinglePathLiteLA step by step for parity, including
their habit of running float32 softmax attention through bfloat16 SDPA and zero-padding odd head widths
to 128 (which also sets the softmax scale to 1/sqrt(128)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.models.ltx2.layers import rms_norm
from vidloom.families.sana_wm.delta_rule import bidirectional_delta_rule
from vidloom.families.sana_wm.parallel import FrameRows
from vidloom.families.sana_wm.rays import RayTransforms, apply_rope, apply_ucpe

GDN_EPS = 1e-8  # denominator epsilon of the main branch's normalisation


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.eps, self.weight)


def _norm(enabled: bool, dim: int, eps: float) -> nn.Module:
    return RMSNorm(dim, eps) if enabled else nn.Identity()


class TemporalShortConv(nn.Module):
    """Depthwise conv along frames (per token position), symmetric: a causal kernel run both ways, the
    centre tap counted once (diffusers' SanaWMTemporalShortConvolution)."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, kernel))

    def _causal(self, x: Tensor) -> Tensor:
        y = F.conv1d(x.transpose(1, 2), self.weight.to(x.dtype), groups=x.shape[-1], padding=self.weight.shape[-1] - 1)
        return y[..., :x.shape[1]].transpose(1, 2)

    def forward(self, x: Tensor, frames: int) -> Tensor:
        b, n, c = x.shape
        s = n // frames
        seq = x.reshape(b, frames, s, c).permute(0, 2, 1, 3).contiguous().reshape(b * s, frames, c)
        out = self._causal(seq) + self._causal(seq.flip(1)).flip(1) - seq * self.weight[:, 0, -1]
        return out.to(x.dtype).reshape(b, s, frames, c).permute(0, 2, 1, 3).reshape(b, n, c)


def _rms_to_reference(reference: Tensor, x: Tensor, eps: float = 1e-6) -> Tensor:
    """Shrink x [B, H, D, N] where its per-token RMS exceeds the reference's (never grows it)."""
    ref = reference.square().mean(dim=2, keepdim=True).add(eps).sqrt()
    cur = x.square().mean(dim=2, keepdim=True).add(eps).sqrt()
    return x * (ref / cur.clamp_min(eps)).clamp(max=1.0)


def _softmax_bf16(q: Tensor, k: Tensor, v: Tensor, pad_heads: bool = False) -> Tensor:
    """[B, H, N, D] SDPA as the reference runs it: float32 inputs go through bfloat16; with `pad_heads`
    (the camera branch) odd head widths are zero-padded to 128/256, which changes the softmax scale too."""
    d = q.shape[-1]
    if q.dtype == torch.float32:
        q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    pad = (128 if d <= 128 else 256) - d if pad_heads and d not in (32, 64, 128, 256) and d < 256 else 0
    if pad:
        q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v)[..., :d]


class CameraSelfAttention(nn.Module):
    """One block's self-attention; `softmax` picks the softmax variant (same parameters, GDN gates unused)."""

    def __init__(self, dim: int, heads: int, *, qk_norm: bool, softmax: bool, conv_kernel: int,
                 k_conv_only: bool) -> None:
        super().__init__()
        self.heads, self.head_dim, self.softmax = heads, dim // heads, softmax
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.q_norm, self.k_norm = _norm(qk_norm, dim, 1e-5), _norm(qk_norm, dim, 1e-5)
        self.beta_proj = nn.Linear(dim, heads)
        self.gate_proj = nn.Linear(dim, heads)
        self.A_log = nn.Parameter(torch.zeros(heads))
        self.dt_bias = nn.Parameter(torch.zeros(heads))
        self.register_buffer("recall_gate", torch.zeros(1))  # in the checkpoint; no forward reads it
        self.output_gate = nn.Linear(dim, dim)
        convs = conv_kernel > 0 and not softmax
        self.conv_k = TemporalShortConv(dim, conv_kernel) if convs else None
        self.conv_q = TemporalShortConv(dim, conv_kernel) if convs and not k_conv_only else None
        self.conv_v = TemporalShortConv(dim, conv_kernel) if convs and not k_conv_only else None
        self.q_proj_cam, self.k_proj_cam, self.v_proj_cam = (nn.Linear(dim, dim) for _ in range(3))
        self.out_proj_cam = nn.Linear(dim, dim)
        self.q_norm_cam, self.k_norm_cam = _norm(qk_norm, dim, 1e-5), _norm(qk_norm, dim, 1e-5)
        self.conv_k_cam = TemporalShortConv(dim, conv_kernel) if convs else None
        self.conv_q_cam = TemporalShortConv(dim, conv_kernel) if convs and not k_conv_only else None
        self.conv_v_cam = TemporalShortConv(dim, conv_kernel) if convs and not k_conv_only else None

    def forward(self, x: Tensor, grid: tuple[int, int, int], rope: Tensor | None,
                rays: RayTransforms | None, rows: FrameRows | None = None) -> Tensor:
        """x [B, N, C]. With `rows` (sequence parallel) x is this rank's band of every frame: the per-token work
        runs on it, and the branch kernels run on every token x this rank's heads between two all-to-alls."""
        b, n, c = x.shape
        frames = grid[0]
        gates = None if self.softmax else self._gates(x, frames, rows)
        q, k, v = self.qkv(x).view(b, n, 3, c).unbind(2)
        q, k, v = self._heads(rows, frames, *self._prepare(q, k, v, frames, self.conv_q, self.conv_k, self.conv_v,
                                                           self.q_norm, self.k_norm))
        out = self._tokens(rows, frames, self._main(q, k, v, frames, rope, gates))
        if rays is not None:
            qc, kc, vc = self._prepare(self.q_proj_cam(x), self.k_proj_cam(x), self.v_proj_cam(x), frames,
                                       self.conv_q_cam, self.conv_k_cam, self.conv_v_cam, self.q_norm_cam,
                                       self.k_norm_cam)
            camera = self._camera(*self._heads(rows, frames, qc, kc, vc), frames, rays, gates)
            out = out + self.out_proj_cam(self._tokens(rows, frames, camera))
        out = out * F.silu(self.output_gate(x).float())
        return self.proj(out.to(x.dtype))

    @staticmethod
    def _heads(rows: FrameRows | None, frames: int, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, ...]:
        """[B, N_band, H, D] each -> [B, N, H/K, D] (one exchange for the three); the identity on one device."""
        return (q, k, v) if rows is None else tuple(rows.to_heads(torch.stack((q, k, v)), frames).unbind(0))

    def _tokens(self, rows: FrameRows | None, frames: int, out: Tensor) -> Tensor:
        """A branch's output [B, N, H/K * D] -> [B, N_band, C]; the identity on one device."""
        return out if rows is None else rows.to_tokens(out.unflatten(-1, (-1, self.head_dim)), frames).flatten(-2)

    def _gates(self, x: Tensor, frames: int, rows: FrameRows | None = None) -> tuple[Tensor, Tensor]:
        """beta [B, H, T, S] per token, decay [B, H, T] per frame (from the frame's mean token). With `rows`: the
        frame means over every band, and both gates for every token of this rank's heads."""
        b, n, c = x.shape
        beta = self.beta_proj(x).sigmoid()
        if rows is None:
            mean = x.reshape(b, frames, -1, c).mean(dim=2)
        else:
            mean = rows.frame_sum(x.reshape(b, frames, -1, c).sum(dim=2)) / (rows.comm.size * n // frames)
            beta = rows.to_heads(beta[..., None], frames)[..., 0]  # [B, N, H/K]
        heads = beta.shape[-1]
        beta = beta.reshape(b, frames, -1, heads).permute(0, 3, 1, 2)
        gate = self.gate_proj(mean).float()
        rate = -self.A_log.float().exp().view(1, 1, -1) * F.softplus(gate + self.dt_bias.float().view(1, 1, -1))
        decay = rate.exp().transpose(1, 2)
        return beta, decay if rows is None else decay[:, rows.heads(self.heads)]

    def _prepare(self, q: Tensor, k: Tensor, v: Tensor, frames: int, conv_q, conv_k, conv_v, q_norm: nn.Module,
                 k_norm: nn.Module) -> tuple[Tensor, Tensor, Tensor]:
        """Short convs, Q/K norm over the full width, ReLU kernel (GDN only); -> [B, N, H, D] each."""
        q = q if conv_q is None else conv_q(q, frames)
        k = k if conv_k is None else conv_k(k, frames)
        v = v if conv_v is None else conv_v(v, frames)
        q, k = q_norm(q), k_norm(k)
        if not self.softmax:
            q, k = F.relu(q), F.relu(k)
        split = lambda t: t.unflatten(-1, (self.heads, self.head_dim))  # noqa: E731
        return split(q), split(k), split(v)

    def _main(self, q: Tensor, k: Tensor, v: Tensor, frames: int, rope: Tensor | None, gates) -> Tensor:
        b, n = q.shape[:2]
        dtype = v.dtype
        if self.softmax:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, N, D]
            if rope is not None:
                q, k = apply_rope(q, rope), apply_rope(k, rope)
            return _softmax_bf16(q, k, v).transpose(1, 2).reshape(b, n, -1).to(dtype)
        k = k * (self.head_dim ** -0.5 * (n // frames) ** -0.5)
        q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))  # [B, H, N, D]
        q_rot, k_rot = (q, k) if rope is None else (apply_rope(q, rope), apply_rope(k, rope))
        to_hdn = lambda t: t.transpose(-1, -2).float()  # noqa: E731
        beta, decay = gates
        out = bidirectional_delta_rule(to_hdn(q), to_hdn(k), to_hdn(v), beta.float(), decay.float(), frames,
                                       q_rot=to_hdn(q_rot), k_rot=to_hdn(k_rot), eps=GDN_EPS)
        return out.to(dtype).permute(0, 3, 1, 2).reshape(b, n, -1)

    def _camera(self, q: Tensor, k: Tensor, v: Tensor, frames: int, rays: RayTransforms, gates) -> Tensor:
        b, n, heads = q.shape[:3]
        dtype = v.dtype
        if not self.softmax:
            k = k * (self.head_dim ** -0.5 * (n // frames) ** -0.5)
        q, k, v = (t.permute(0, 2, 3, 1) for t in (q, k, v))  # [B, H, D, N]
        encode = lambda t, m: apply_ucpe(t.transpose(-1, -2), m, rays.rope).transpose(-1, -2)  # noqa: E731
        q_ray = _rms_to_reference(q, encode(q, rays.query))
        k_ray = _rms_to_reference(k, encode(k, rays.key_value))
        v_ray = _rms_to_reference(v, encode(v, rays.key_value))
        if self.softmax:
            out = _softmax_bf16(*(t.transpose(-1, -2).float() for t in (q_ray, k_ray, v_ray)), pad_heads=True)
            out = out.transpose(-1, -2)
        else:
            beta, decay = gates
            # UCPE translations inflate key norms; the delta rule's write strength is discounted by as much.
            before = torch.linalg.vector_norm(k, dim=2, keepdim=True).clamp_min(1e-6)
            after = torch.linalg.vector_norm(k_ray, dim=2, keepdim=True).clamp_min(1e-6)
            inflation = ((after / before) ** 2).view(b, heads, frames, -1).mean(dim=-1)
            beta = beta / inflation.unsqueeze(-1).clamp_min(1.0)
            out = bidirectional_delta_rule(q_ray.float(), k_ray.float(), v_ray.float(), beta.float(), decay.float(),
                                           frames)
        out = out.to(dtype)
        out = apply_ucpe(out.transpose(-1, -2), rays.world_to_ray, rays.rope, inverse_rope=True).transpose(-1, -2)
        return out.reshape(b, -1, n).permute(0, 2, 1)


class CrossAttention(nn.Module):
    """Image tokens attend to the text tokens (padding masked out)."""

    def __init__(self, dim: int, heads: int, qk_norm: bool) -> None:
        super().__init__()
        self.heads = heads
        self.q_linear = nn.Linear(dim, dim)
        self.kv_linear = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.q_norm, self.k_norm = _norm(qk_norm, dim, 1e-6), _norm(qk_norm, dim, 1e-6)

    def context_kv(self, text: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (normed) and values [B, H, L, Dh] of text tokens [B, L, C]: what forward's `text` takes instead, so
        a request's prompt is projected once (layers.prompt_kv)."""
        b, _, c = text.shape
        k, v = self.kv_linear(text).view(b, -1, 2, c).unbind(2)
        split = lambda t: t.view(b, -1, self.heads, c // self.heads).transpose(1, 2)  # noqa: E731
        return split(self.k_norm(k)), split(v)

    def forward(self, x: Tensor, text: Tensor | tuple[Tensor, Tensor], text_mask: Tensor) -> Tensor:
        b, _, c = x.shape
        k, v = text if isinstance(text, tuple) else self.context_kv(text)
        q = self.q_norm(self.q_linear(x)).view(b, -1, self.heads, c // self.heads).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=text_mask.bool()[:, None, None, :])
        return self.proj(out.transpose(1, 2).reshape(b, -1, c).type_as(q))
