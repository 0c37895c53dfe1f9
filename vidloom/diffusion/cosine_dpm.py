"""The cosine DPM-Solver++ SDE sampler of Stable Audio Open (EDM preconditioning, v-prediction).

Matches diffusers' `CosineDPMSolverMultistepScheduler` step for step: sigmas on an exponential or Karras ramp
from sigma_max down to sigma_min then 0; the network sees x * c_in(sigma) and the noise level
atan(sigma) * 2 / pi; its output becomes a data prediction through the EDM skip/out scalings; first- or
second-order (midpoint or Heun) multistep SDE updates add Brownian-tree noise. The noise is a torchsde
BrownianInterval seeded with the request seed, built exactly as the reference builds it, so the same seed gives
the same waveform; torchsde is an optional dependency (`pip install vidloom[audio]`).

The sampler holds no state: one request's history lives in its CosineDPMState.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.loading.key_policy import KeyPolicy

DIFFUSERS_CLASS_NAME = "CosineDPMSolverMultistepScheduler"
# Every CosineDPMSolverMultistepScheduler.__init__ argument since its first release (diffusers 0.30, 2024-07).
SCHEDULER_POLICY = KeyPolicy(
    frozenset({"sigma_min", "sigma_max", "sigma_data", "sigma_schedule", "solver_order", "prediction_type", "rho",
               "solver_type", "lower_order_final", "euler_at_final", "final_sigmas_type"}),
    harmless={"num_train_timesteps": "sizes the reference's training timestep table; sampling reads sigmas only"},
)
CONFIG_KEYS = SCHEDULER_POLICY.known
# The reference's Brownian interval settings (diffusers BatchedBrownianTree): changing them changes the noise.
BROWNIAN_TOL = 1e-6
BROWNIAN_POOL = 24
# The reference queries the interval down to sigma 0, below its start (sigma_min): torchsde extends the path there
# and warns on every such query; the warning says nothing a user can act on.
warnings.filterwarnings("ignore", message=r"Should have .* but got", category=UserWarning, module=r"torchsde")
# Below this many steps the reference drops to lower orders at the end (lower_order_final).
LOWER_ORDER_BELOW = 15


@dataclass(frozen=True)
class CosineDPMConfig:
    """scheduler/scheduler_config.json (num_train_timesteps only sizes the training table, unused here)."""

    sigma_min: float = 0.3
    sigma_max: float = 500.0
    sigma_data: float = 1.0
    sigma_schedule: str = "exponential"  # or "karras"
    solver_order: int = 2
    prediction_type: str = "v_prediction"  # or "epsilon"
    rho: float = 7.0
    solver_type: str = "midpoint"  # or "heun"
    lower_order_final: bool = True
    euler_at_final: bool = False
    # "sigma_min" is refused: the ramp already ends at sigma_min, so the last step would not move and its
    # zero-length Brownian interval cannot be sampled (the reference recurses without end there).
    final_sigmas_type: str = "zero"

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> CosineDPMConfig:
        name = cfg.get("_class_name", DIFFUSERS_CLASS_NAME)
        if name != DIFFUSERS_CLASS_NAME:
            raise ValueError(f"scheduler {name!r} is not supported (expected {DIFFUSERS_CLASS_NAME})")
        SCHEDULER_POLICY.check(cfg, "scheduler config")
        d = cls()
        solver_type = cfg.get("solver_type", d.solver_type)
        if solver_type in ("logrho", "bh1", "bh2"):  # the reference maps these to midpoint
            solver_type = "midpoint"
        config = cls(
            sigma_min=float(cfg.get("sigma_min", d.sigma_min)), sigma_max=float(cfg.get("sigma_max", d.sigma_max)),
            sigma_data=float(cfg.get("sigma_data", d.sigma_data)),
            sigma_schedule=cfg.get("sigma_schedule", d.sigma_schedule), solver_order=cfg.get("solver_order", 2),
            prediction_type=cfg.get("prediction_type", d.prediction_type), rho=float(cfg.get("rho", d.rho)),
            solver_type=solver_type, lower_order_final=bool(cfg.get("lower_order_final", True)),
            euler_at_final=bool(cfg.get("euler_at_final", False)),
            final_sigmas_type=cfg.get("final_sigmas_type", d.final_sigmas_type),
        )
        checks = (("sigma_schedule", ("exponential", "karras")), ("solver_order", (1, 2)),
                  ("prediction_type", ("v_prediction", "epsilon")), ("solver_type", ("midpoint", "heun")),
                  ("final_sigmas_type", ("zero",)))
        for key, allowed in checks:
            if getattr(config, key) not in allowed:
                raise ValueError(f"scheduler: {key}={getattr(config, key)!r} is not supported; expected one of "
                                 f"{list(allowed)}")
        if not 0 < config.sigma_min < config.sigma_max:
            raise ValueError("scheduler: needs 0 < sigma_min < sigma_max")
        return config

    @property
    def init_noise_sigma(self) -> float:
        """The initial noise's standard deviation: sqrt(sigma_max^2 + 1)."""
        return (self.sigma_max**2 + 1) ** 0.5

    def sigmas(self, steps: int) -> Tensor:
        """float32 [steps + 1], from sigma_max down, then the final sigma (the reference's arithmetic)."""
        ramp = torch.linspace(0, 1, steps)
        if self.sigma_schedule == "karras":
            lo, hi = self.sigma_min ** (1 / self.rho), self.sigma_max ** (1 / self.rho)
            sigmas = (hi + ramp * (lo - hi)) ** self.rho
        else:
            sigmas = torch.linspace(math.log(self.sigma_min), math.log(self.sigma_max), steps).exp().flip(0)
        return torch.cat([sigmas.to(torch.float32), torch.zeros(1, dtype=torch.float32)])

    @staticmethod
    def noise_level(sigma: Tensor) -> Tensor:
        """What the network reads as its timestep: atan(sigma) * 2 / pi."""
        return sigma.atan() / math.pi * 2

    def scale_input(self, sample: Tensor, sigma: Tensor) -> Tensor:
        """x * c_in(sigma), c_in = 1 / sqrt(sigma^2 + sigma_data^2)."""
        return sample * (1 / ((sigma**2 + self.sigma_data**2) ** 0.5))

    def denoised(self, sample: Tensor, output: Tensor, sigma: Tensor) -> Tensor:
        """The data prediction c_skip * x + c_out * output (EDM; c_out negated for v-prediction)."""
        sd = self.sigma_data
        skip = sd**2 / (sigma**2 + sd**2)
        out = sigma * sd / (sigma**2 + sd**2) ** 0.5
        if self.prediction_type == "v_prediction":
            out = -sigma * sd / (sigma**2 + sd**2) ** 0.5
        return skip * sample + out * output


class BrownianNoise:
    """Noise between two sigmas from one Brownian interval over [sigma_min, sigma_max] seeded with `seed`
    (a torchsde BrownianInterval, set up as diffusers' BrownianTreeNoiseSampler sets it up)."""

    def __init__(self, like: Tensor, sigma_min: float, sigma_max: float, seed: int) -> None:
        try:
            import torchsde
        except ImportError:  # checked at load (families.stable_audio.load); this guards direct use
            raise RuntimeError("the cosine DPM-solver needs torchsde: pip install 'vidloom[audio]'") from None
        self.tree = torchsde.BrownianInterval(
            t0=torch.as_tensor(sigma_min), t1=torch.as_tensor(sigma_max), size=like.shape, dtype=like.dtype,
            device=like.device, entropy=seed, tol=BROWNIAN_TOL, pool_size=BROWNIAN_POOL, halfway_tree=True)

    def __call__(self, sigma: Tensor, sigma_next: Tensor) -> Tensor:
        # The interval is queried low to high and the increment negated: time runs from sigma down to sigma_next.
        lo, hi = (sigma, sigma_next) if sigma < sigma_next else (sigma_next, sigma)
        sign = 1.0 if sigma < sigma_next else -1.0
        return self.tree(lo, hi) * sign / (sigma_next - sigma).abs().sqrt()


@dataclass
class CosineDPMState:
    """One request's sampler state: its sigmas, data predictions so far, and its noise source."""

    sigmas: Tensor  # float32 [steps + 1] on the CPU
    seed: int
    index: int = 0
    previous: Tensor | None = None  # the last step's data prediction (second order)
    lower_order_nums: int = 0
    noise: BrownianNoise | None = field(default=None, repr=False)

    @property
    def steps(self) -> int:
        return len(self.sigmas) - 1


def start(config: CosineDPMConfig, steps: int, seed: int) -> CosineDPMState:
    return CosineDPMState(sigmas=config.sigmas(steps), seed=seed)


def step(config: CosineDPMConfig, state: CosineDPMState, output: Tensor, sample: Tensor) -> Tensor:
    """Advance `sample` from sigmas[index] to sigmas[index + 1] given the network's `output` there.

    The update follows the reference scheduler's formulas in its operation order (bit parity; see NOTICE).
    """
    i, n = state.index, state.steps
    sigmas = state.sigmas
    x0 = config.denoised(sample, output, sigmas[i])
    if state.noise is None:
        state.noise = BrownianNoise(x0, config.sigma_min, config.sigma_max, state.seed)
    noise = state.noise(sigmas[i], sigmas[i + 1]).to(x0.device)
    short = config.lower_order_final and n < LOWER_ORDER_BELOW
    last = i == n - 1 and (config.euler_at_final or short or config.final_sigmas_type == "zero")
    if config.solver_order == 1 or state.lower_order_nums < 1 or last:
        prev = _first_order(sigmas[i + 1], sigmas[i], x0, sample, noise)
    else:
        prev = _second_order(config.solver_type, sigmas[i + 1], sigmas[i], sigmas[i - 1], x0, state.previous,
                             sample, noise)
    state.previous = x0
    state.lower_order_nums = min(state.lower_order_nums + 1, config.solver_order)
    state.index += 1
    return prev


def _log_snr(sigma: Tensor) -> Tensor:
    # lambda = log(alpha) - log(sigma) with alpha = 1 (inputs are pre-scaled); 0 - x is exactly -x.
    return -torch.log(sigma)


def _first_order(sigma_t: Tensor, sigma_s: Tensor, x0: Tensor, sample: Tensor, noise: Tensor) -> Tensor:
    h = _log_snr(sigma_t) - _log_snr(sigma_s)
    return ((sigma_t / sigma_s * torch.exp(-h)) * sample + (1 - torch.exp(-2.0 * h)) * x0
            + sigma_t * torch.sqrt(1.0 - torch.exp(-2 * h)) * noise)


def _second_order(kind: str, sigma_t: Tensor, sigma_s0: Tensor, sigma_s1: Tensor, m0: Tensor, m1: Tensor,
                  sample: Tensor, noise: Tensor) -> Tensor:
    lambda_t, lambda_s0, lambda_s1 = _log_snr(sigma_t), _log_snr(sigma_s0), _log_snr(sigma_s1)
    h, h_0 = lambda_t - lambda_s0, lambda_s0 - lambda_s1
    r0 = h_0 / h
    d1 = (1.0 / r0) * (m0 - m1)
    decay = 1 - torch.exp(-2.0 * h)
    x = (sigma_t / sigma_s0 * torch.exp(-h)) * sample + decay * m0
    if kind == "midpoint":
        x = x + 0.5 * decay * d1
    else:
        x = x + (decay / (-2.0 * h) + 1.0) * d1
    return x + sigma_t * torch.sqrt(1.0 - torch.exp(-2 * h)) * noise
