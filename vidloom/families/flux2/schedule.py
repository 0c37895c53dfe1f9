"""Flux2 Klein's sigma schedule: linear sigmas bent by an image-size- and step-dependent shift."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from vidloom.loading.config_keys import check_class_name
from vidloom.loading.key_policy import KeyPolicy, Refusal

# Every FlowMatchEulerDiscreteScheduler.__init__ argument since the class's first release (diffusers 0.29,
# 2024-06) is one of these.
SCHEDULER_POLICY = KeyPolicy(
    frozenset({"num_train_timesteps", "use_dynamic_shifting", "time_shift_type"}),
    # Read by nothing once use_dynamic_shifting is on (required below): the Klein pipeline passes its own
    # empirical mu to set_timesteps, so neither the static shift nor the resolution-based mu line is used.
    harmless=dict.fromkeys(("shift", "base_shift", "max_shift", "base_image_seq_len", "max_image_seq_len"),
                           "the Klein pipeline passes its own empirical mu with use_dynamic_shifting, so the static "
                           "shift and the resolution-based mu line are unused"),
    quiet=frozenset({"shift", "base_shift", "max_shift", "base_image_seq_len", "max_image_seq_len"}),
    refused={**{key: Refusal((False, None), "a sigma spacing other than the flow-matching linspace, not implemented")
                for key in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas")},
             "invert_sigmas": Refusal((False, None), "reversed sigmas (an editing schedule), not implemented"),
             "stochastic_sampling": Refusal((False, None), "re-noising Euler steps, not implemented"),
             "shift_terminal": Refusal((None, 0.0), "a stretched last sigma, not implemented for Klein")},
)
CONFIG_KEYS = SCHEDULER_POLICY.known


def empirical_mu(image_seq_len: int, num_steps: int) -> float:
    """The shift exponent the Klein pipeline uses (diffusers `compute_empirical_mu`; constants from BFL's fit)."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    if image_seq_len > 4300:
        return float(a2 * image_seq_len + b2)
    m_200 = a2 * image_seq_len + b2
    m_10 = a1 * image_seq_len + b1
    a = (m_200 - m_10) / 190.0
    return float(a * num_steps + (m_200 - 200.0 * a))


@dataclass(frozen=True)
class Flux2Schedule:
    """Reads the checkpoint's scheduler config; `sigmas` gives one request's schedule."""

    num_train_timesteps: int = 1000
    exponential: bool = True  # time_shift_type: exponential (Klein) or linear

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> Flux2Schedule:
        check_class_name(cfg, ("FlowMatchEulerDiscreteScheduler",), "scheduler config")
        SCHEDULER_POLICY.check(cfg, "scheduler config")
        if not cfg.get("use_dynamic_shifting", False):
            raise ValueError("scheduler: use_dynamic_shifting must be true for Flux2 Klein")
        kind = cfg.get("time_shift_type", "exponential")
        if kind not in ("exponential", "linear"):
            raise ValueError(f"scheduler: time_shift_type {kind!r} is not supported")
        return cls(num_train_timesteps=int(cfg.get("num_train_timesteps", 1000)), exponential=kind == "exponential")

    def sigmas(self, steps: int, image_seq_len: int) -> torch.Tensor:
        """float32 [steps + 1] sigmas ending at 0. Same numpy float32 arithmetic as the reference
        scheduler's set_timesteps, so the timesteps match it bit for bit."""
        mu = empirical_mu(image_seq_len, steps)
        base = np.linspace(1.0, 1.0 / steps, steps).astype(np.float32)
        if self.exponential:
            shifted = math.exp(mu) / (math.exp(mu) + (1 / base - 1) ** 1.0)
        else:
            shifted = mu / (mu + (1 / base - 1) ** 1.0)
        sigmas = torch.from_numpy(np.asarray(shifted)).to(torch.float32)
        return torch.cat([sigmas, torch.zeros(1)])
