"""The bidirectional gated delta rule of SANA-WM's linear-attention blocks, in float32.

Each head keeps a D x D state over frames (the spatial tokens of a frame are summed into its update):
    W[t] = decay[t] * (I - (k[t] * beta[t]) k[t]^T),   U[t] = (v[t] * beta[t]) k[t]^T
    S[t] = S[t-1] W[t] + U[t],                          out[t] = S[t] q[t]
The backward direction runs the same recurrence over the reversed frames, shifted by one so frame t
sees frames t+1..T only; both directions are summed. The main branch also carries a "mass" stream
(a D x 1 state over unrotated keys) that normalises the output. The recurrences follow diffusers'
`torch_chunk_sana_gdn` / `torch_chunk_cam_single_path_delta_rule` (a chunked scan; chunking changes
no result, so this scan is plain).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _frames(x: Tensor, frames: int) -> Tensor:
    """[B, H, D, N] -> [B, H, T, D, S]."""
    b, h, d, n = x.shape
    return x.view(b, h, d, frames, n // frames).permute(0, 1, 3, 2, 4)


def _tokens(x: Tensor) -> Tensor:
    """[B, H, T, D, S] -> [B, H, D, T*S]."""
    b, h, t, d, s = x.shape
    return x.permute(0, 1, 3, 2, 4).reshape(b, h, d, t * s)


def _transitions(k: Tensor, beta: Tensor, decay: Tensor) -> Tensor:
    eye = torch.eye(k.shape[3], dtype=k.dtype, device=k.device)
    return decay * (eye - torch.matmul(k * beta, k.transpose(-1, -2)))


def _scan_right(w: Tensor, u: Tensor) -> Tensor:
    """States S[t] = S[t-1] @ W[t] + U[t] for every t (S[-1] = 0), stacked on dim 2."""
    state = torch.zeros_like(u[:, :, 0])
    states = []
    for t in range(w.shape[2]):
        state = torch.matmul(state, w[:, :, t]) + u[:, :, t]
        states.append(state)
    return torch.stack(states, dim=2)


def _scan_left(w: Tensor, u: Tensor) -> Tensor:
    """States S[t] = W[t] @ S[t-1] + U[t] (the mass stream multiplies from the left)."""
    state = torch.zeros_like(u[:, :, 0])
    states = []
    for t in range(w.shape[2]):
        state = torch.matmul(w[:, :, t], state) + u[:, :, t]
        states.append(state)
    return torch.stack(states, dim=2)


def _reverse_shifted(x: Tensor, fill: float) -> Tensor:
    """Reverse the frame axis (dim 2) and shift right by one: [x0..x3] -> [fill, x3, x2, x1]."""
    flipped = torch.flip(x, dims=[2]).narrow(2, 0, x.shape[2] - 1)
    pad = torch.full((*x.shape[:2], 1, *x.shape[3:]), fill, dtype=x.dtype, device=x.device)
    return torch.cat([pad, flipped], dim=2)


def _one_direction(q: Tensor, q_rot: Tensor, k: Tensor, k_rot: Tensor, v: Tensor, beta: Tensor, decay: Tensor,
                   with_mass: bool) -> tuple[Tensor, Tensor | None]:
    """Frame-major tensors [B, H, T, D, S]; beta [B, H, T, 1, S]; decay [B, H, T, 1, 1]."""
    states = _scan_right(_transitions(k_rot, beta, decay), torch.matmul(v * beta, k_rot.transpose(-1, -2)))
    numerator = torch.matmul(states, q_rot)
    if not with_mass:
        return numerator, None
    mass = _scan_left(_transitions(k, beta, decay), (k * beta).sum(dim=-1, keepdim=True))
    return numerator, torch.matmul(mass.transpose(-1, -2), q)


def bidirectional_delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, decay: Tensor, frames: int, *,
                             q_rot: Tensor | None = None, k_rot: Tensor | None = None,
                             eps: float | None = None) -> Tensor:
    """q/k/v [B, H, D, N] (float32), beta [B, H, T, S], decay [B, H, T] -> [B, H, D, N].

    With `eps` (the main branch) q_rot/k_rot (RoPE-rotated) drive the numerator and the output is divided
    by the mass stream of the unrotated q/k plus eps; without it (the camera branch) q/k drive the
    numerator alone.
    """
    with_mass = eps is not None
    q_rot = q if q_rot is None else q_rot
    k_rot = k if k_rot is None else k_rot
    qf, qrf, kf, krf, vf = (_frames(x, frames) for x in (q, q_rot, k, k_rot, v))
    b, h = beta.shape[:2]
    beta_f = beta.reshape(b, h, frames, 1, -1)
    decay_f = decay.view(b, h, frames, 1, 1)
    num_fwd, den_fwd = _one_direction(qf, qrf, kf, krf, vf, beta_f, decay_f, with_mass)
    num_bwd, den_bwd = _one_direction(
        torch.flip(qf, dims=[2]), torch.flip(qrf, dims=[2]), _reverse_shifted(kf, 0.0), _reverse_shifted(krf, 0.0),
        _reverse_shifted(vf, 0.0), _reverse_shifted(beta_f, 0.0), _reverse_shifted(decay_f, 1.0), with_mass)
    numerator = _tokens(num_fwd + torch.flip(num_bwd, dims=[2]))
    if not with_mass:
        return numerator
    return numerator / (_tokens(den_fwd + torch.flip(den_bwd, dims=[2])) + eps)
