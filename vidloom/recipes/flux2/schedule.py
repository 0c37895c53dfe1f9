"""Flux2 Klein's sigma schedule: linear sigmas bent by an image-size- and step-dependent shift."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from vidloom.loading.key_policy import KeyPolicy

# Settings of FlowMatchEulerDiscreteScheduler that would change the schedule and that we do not implement.
_UNSUPPORTED = ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas",
                "stochastic_sampling", "shift_terminal")
# Read by nothing once use_dynamic_shifting is on: the Klein pipeline passes its own empirical mu to
# set_timesteps, so neither the static shift nor the resolution-based mu line (base/max shift) is used.
_INERT = ("shift", "base_shift", "max_shift", "base_image_seq_len", "max_image_seq_len")
# Every FlowMatchEulerDiscreteScheduler.__init__ argument (diffusers 0.42) is one of these.
CONFIG_KEYS = frozenset({"num_train_timesteps", "use_dynamic_shifting", "time_shift_type", *_UNSUPPORTED, *_INERT})


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
        name = cfg.get("_class_name", "FlowMatchEulerDiscreteScheduler")
        if name != "FlowMatchEulerDiscreteScheduler":
            raise ValueError(f"scheduler {name!r} is not supported (expected FlowMatchEulerDiscreteScheduler)")
        KeyPolicy(CONFIG_KEYS).check(cfg, "scheduler config")
        if not cfg.get("use_dynamic_shifting", False):
            raise ValueError("scheduler: use_dynamic_shifting must be true for Flux2 Klein")
        for key in _UNSUPPORTED:
            if cfg.get(key):
                raise ValueError(f"scheduler: {key}={cfg[key]!r} is not supported")
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
