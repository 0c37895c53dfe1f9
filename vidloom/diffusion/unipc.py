"""UniPC on flow sigmas, numerically equal to diffusers' UniPCMultistepScheduler as Wan and Cosmos3 set it up.

The predictor/corrector update follows diffusers' UniPCMultistepScheduler (Apache-2.0) step by
step, in the same order of operations: bit-parity with it (tests/parity/test_samplers_vs_diffusers.py)
requires that. The sampler state and interfaces around it are ours. Credited in NOTICE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from vidloom.diffusion.sampler import ConfiguredSampler, Schedule, check_index, shift_sigmas

# UniPC: Zhao et al. 2023, "UniPC: A Unified Predictor-Corrector Framework for Fast
# Sampling of Diffusion Models", arXiv:2302.04867. We implement the data-prediction
# (x0) form (which steps in -h) with B(h) = e^h - 1 ("bh2"), on the flow path
# x = (1 - sigma) x0 + sigma eps, so alpha = 1 - sigma and lambda = log(alpha / sigma).

# diffusers nudges a first sigma of exactly 1 down by this much, because alpha = 0
# there and log(alpha) would be -inf in the first updates.
_FIRST_SIGMA_EPS = 1e-6


def karras_flow_sigmas(num_steps: int, sigma_min: float, sigma_max: float) -> np.ndarray:
    """Karras et al. 2022 (EDM, arXiv:2206.00364, eq. 5, rho = 7) noise levels mapped onto the flow path.

    An EDM sigma s (x = x0 + s * eps) is the flow sigma s / (1 + s) after rescaling x by 1 / (1 + s);
    this is how diffusers' UniPCMultistepScheduler combines use_karras_sigmas with use_flow_sigmas (no
    flow shift, no nudge of the first sigma), in the same float64 operation order so the float32
    sigmas and the truncated timesteps come out identical.
    """
    rho = 7.0
    ramp = np.linspace(0, 1, num_steps)
    min_inv_rho, max_inv_rho = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    edm = (max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** rho
    return edm / (edm + 1)


@dataclass
class UniPCState:
    """Everything one request accumulates; the sampler itself holds none of it."""

    schedule: Schedule
    # x0 predictions of the most recent steps, newest last, at most solver_order of them.
    history: list[torch.Tensor] = field(default_factory=list)
    # Sample the last predictor started from; the next step's corrector redoes that update.
    last_sample: torch.Tensor | None = None
    # Order the last predictor ran at; the corrector that revisits it uses the same order.
    last_order: int = 0
    # Steps taken so far, capped at solver_order: the multistep warm-up (diffusers' lower_order_nums).
    warmup: int = 0
    next_index: int = 0


@dataclass(frozen=True)
class _BhTerms:
    """Scalars and differences one UniP or UniC update needs (all from the paper's B(h) form)."""

    ratio: torch.Tensor  # sigma_t / sigma_s0
    alpha_t: torch.Tensor
    h_phi_1: torch.Tensor  # e^{-h} - 1
    b_h: torch.Tensor  # B(h) = e^{-h} - 1 (bh2)
    r: torch.Tensor  # R_p: rows are r_k^(i-1), the Vandermonde system of the paper
    b: torch.Tensor  # right-hand side: i! * h*phi_{i+1}(h) / B(h)
    d1s: list[torch.Tensor]  # (m_k - m0) / r_k for the older outputs


def _lambda(sigma: torch.Tensor) -> torch.Tensor:
    # Half log-SNR of the flow path; sigma = 0 gives +inf, which the updates tolerate.
    return torch.log(1 - sigma) - torch.log(sigma)


def _bh_terms(
    sigmas: torch.Tensor, t: int, s0: int, history: list[torch.Tensor], order: int
) -> _BhTerms:
    """Terms for an update from sigmas[s0] to sigmas[t], using history[-order:] (m0 = history[-1])."""
    sigma_t, sigma_s0 = sigmas[t], sigmas[s0]
    alpha_t = 1 - sigma_t
    lambda_s0 = _lambda(sigma_s0)
    h = _lambda(sigma_t) - lambda_s0
    m0 = history[-1]

    rks: list[torch.Tensor] = []
    d1s: list[torch.Tensor] = []
    for k in range(1, order):
        rk = (_lambda(sigmas[s0 - k]) - lambda_s0) / h
        rks.append(rk)
        d1s.append((history[-(k + 1)] - m0) / rk)
    rks.append(torch.ones((), device=sigmas.device))
    rk_vec = torch.stack(rks)

    # Data prediction integrates in -h; phi_k obeys phi_{k+1} = (phi_k - 1/k!) / h.
    hh = -h
    h_phi_1 = torch.expm1(hh)
    h_phi_k = h_phi_1 / hh - 1
    b_h = torch.expm1(hh)
    rows: list[torch.Tensor] = []
    rhs: list[torch.Tensor] = []
    factorial = 1
    for i in range(1, order + 1):
        rows.append(torch.pow(rk_vec, i - 1))
        rhs.append(h_phi_k * factorial / b_h)
        factorial *= i + 1
        h_phi_k = h_phi_k / hh - 1 / factorial
    return _BhTerms(
        ratio=sigma_t / sigma_s0,
        alpha_t=alpha_t,
        h_phi_1=h_phi_1,
        b_h=b_h,
        r=torch.stack(rows),
        b=torch.stack(rhs),
        d1s=d1s,
    )


def _combine(rhos: torch.Tensor, d1s: list[torch.Tensor]) -> torch.Tensor:
    # sum_k rho_k * D1_k, batch-first like diffusers' einsum so the reduction order matches.
    return torch.einsum("k,bk...->b...", rhos, torch.stack(d1s, dim=1))


class UniPCSampler(ConfiguredSampler):
    """UniP-p predictor plus UniC corrector, order warm-up at the start and lowering at the end."""

    name: ClassVar[str] = "unipc"

    def _schedule(self, num_steps: int) -> Schedule:
        cfg = self.config
        n_train = cfg.num_train_timesteps
        # float64 numpy throughout, as diffusers computes flow sigmas for UniPC.
        if cfg.karras_sigmas is not None:
            sigmas = karras_flow_sigmas(num_steps, *cfg.karras_sigmas)
        else:
            if cfg.native_flow_schedule:
                base = np.linspace(1.0 - 1.0 / n_train, 0.0, num_steps + 1)[:-1]
            else:
                base = np.linspace(1, 1 / n_train, num_steps + 1)[:-1]
            sigmas = shift_sigmas(base, cfg.shift)
            if np.fabs(sigmas[0] - 1) < _FIRST_SIGMA_EPS:
                sigmas[0] -= _FIRST_SIGMA_EPS
        # diffusers casts these to int64, truncating: the first timestep is 999, not 1000.
        timesteps = torch.from_numpy(sigmas * n_train).to(torch.int64)
        final = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        return Schedule(timesteps=timesteps, sigmas=torch.from_numpy(final))

    def init_state(
        self, schedule: Schedule, start: int = 0, generator: torch.Generator | None = None
    ) -> UniPCState:
        # Starting mid-schedule (video-to-video) begins a fresh multistep history at `start`,
        # as diffusers' scheduler does when its first step() sees a later timestep.
        check_index(schedule, start)
        return UniPCState(schedule=schedule, next_index=start)

    def step(
        self, state: UniPCState, index: int, model_output: torch.Tensor, sample: torch.Tensor
    ) -> torch.Tensor:
        check_index(state.schedule, index)
        if index != state.next_index:
            raise ValueError(f"UniPC is multistep: expected step {state.next_index}, got {index}")
        cfg = self.config
        sigmas = state.schedule.sigmas

        # The model predicts velocity v = eps - x0, so x0 = x - sigma * v.
        x0 = sample - sigmas[index] * model_output

        if index > 0 and (index - 1) not in cfg.disable_corrector and state.last_sample is not None:
            sample = self._correct(state, index, x0, sample)

        state.history = [*state.history, x0][-cfg.solver_order :]
        # Warm up from order 1 since older outputs don't exist yet; near the end, lower the
        # order so the last step (to sigma = 0, where h is infinite) is first order.
        order = min(cfg.solver_order, state.schedule.num_steps - index, state.warmup + 1)
        state.last_sample = sample
        state.last_order = order
        prev = self._predict(state, index, sample, order)
        state.warmup = min(state.warmup + 1, cfg.solver_order)
        state.next_index = index + 1
        return prev

    def _predict(self, state: UniPCState, index: int, x: torch.Tensor, order: int) -> torch.Tensor:
        """UniP-p: explicit step from sigmas[index] to sigmas[index + 1]."""
        device = x.device
        # Like diffusers, the scalar math runs on the sample's device.
        terms = _bh_terms(state.schedule.sigmas.to(device), index + 1, index, state.history, order)
        x_t = terms.ratio * x - terms.alpha_t * terms.h_phi_1 * state.history[-1]
        if terms.d1s:
            if order == 2:
                # The 1x1 system's solution; diffusers hard-codes it rather than solving.
                rhos = torch.ones(1, dtype=x.dtype, device=device) * 0.5
            else:
                rhos = torch.linalg.solve(terms.r[:-1, :-1], terms.b[:-1]).to(device).to(x.dtype)
            x_t = x_t - terms.alpha_t * terms.b_h * _combine(rhos, terms.d1s)
        return x_t.to(x.dtype)

    def _correct(
        self, state: UniPCState, index: int, model_t: torch.Tensor, x_t: torch.Tensor
    ) -> torch.Tensor:
        """UniC: redo the last update from last_sample, now also using this step's x0 prediction."""
        x = state.last_sample
        assert x is not None
        device = x_t.device
        order = state.last_order
        # history has not yet received model_t, so m0 is the previous step's output.
        terms = _bh_terms(state.schedule.sigmas.to(device), index, index - 1, state.history, order)
        if order == 1:
            rhos = torch.ones(1, dtype=x.dtype, device=device) * 0.5
        else:
            rhos = torch.linalg.solve(terms.r, terms.b).to(device).to(x.dtype)
        m0 = state.history[-1]
        x_base = terms.ratio * x - terms.alpha_t * terms.h_phi_1 * m0
        corr = rhos[-1] * (model_t - m0)
        if terms.d1s:
            corr = _combine(rhos[:-1], terms.d1s) + corr
        return (x_base - terms.alpha_t * terms.b_h * corr).to(x.dtype)
