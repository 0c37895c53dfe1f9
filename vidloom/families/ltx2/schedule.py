"""LTX-2's sigma schedule: linear sigmas, shifted by a token-count-dependent mu, stretched to a terminal sigma."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from vidloom.core.errors import InvalidRequest
from vidloom.loading.config_keys import check_class_name
from vidloom.loading.key_policy import KeyPolicy, Refusal

# Every FlowMatchEulerDiscreteScheduler.__init__ argument since its first release (diffusers 0.29, 2024-06):
# read, or refused when set to a schedule we do not implement.
SCHEDULER_POLICY = KeyPolicy(
    frozenset({"num_train_timesteps", "shift", "use_dynamic_shifting", "base_shift", "max_shift",
               "base_image_seq_len", "max_image_seq_len", "shift_terminal", "time_shift_type"}),
    refused={**{key: Refusal((False, None), "a sigma spacing other than the flow-matching linspace, not implemented")
                for key in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas")},
             "invert_sigmas": Refusal((False, None), "reversed sigmas (an editing schedule), not implemented"),
             "stochastic_sampling": Refusal((False, None), "re-noising Euler steps, not implemented")},
)
CONFIG_KEYS = SCHEDULER_POLICY.known


@dataclass(frozen=True)
class LTX2Schedule:
    """The scheduler config the pipeline reads; `sigmas` builds one request's schedule.

    Defaults are LTX2Pipeline's fallbacks for keys the config lacks (base/max shift 0.95/2.05 over
    1024..4096 tokens, pipeline_ltx2.py step 5).
    """

    num_train_timesteps: int = 1000
    dynamic: bool = True  # use_dynamic_shifting: mu from the token count; else the static `shift`
    shift: float = 1.0
    exponential: bool = True  # time_shift_type
    base_seq_len: int = 1024
    max_seq_len: int = 4096
    base_shift: float = 0.95
    max_shift: float = 2.05
    terminal: float | None = None  # shift_terminal: the last sigma is stretched to this

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> LTX2Schedule:
        check_class_name(cfg, ("FlowMatchEulerDiscreteScheduler",), "scheduler config")
        SCHEDULER_POLICY.check(cfg, "scheduler config")
        kind = cfg.get("time_shift_type", "exponential")
        if kind not in ("exponential", "linear"):
            raise ValueError(f"scheduler: time_shift_type {kind!r} is not supported")
        return cls(
            num_train_timesteps=int(cfg.get("num_train_timesteps", 1000)),
            dynamic=bool(cfg.get("use_dynamic_shifting", False)), shift=float(cfg.get("shift", 1.0)),
            exponential=kind == "exponential", base_seq_len=int(cfg.get("base_image_seq_len", 1024)),
            max_seq_len=int(cfg.get("max_image_seq_len", 4096)), base_shift=float(cfg.get("base_shift", 0.95)),
            max_shift=float(cfg.get("max_shift", 2.05)), terminal=cfg.get("shift_terminal") or None,
        )

    def mu(self, tokens: int) -> float:
        """Linear in the video token count between (base_seq_len, base_shift) and (max_seq_len, max_shift)."""
        slope = (self.max_shift - self.base_shift) / (self.max_seq_len - self.base_seq_len)
        return tokens * slope + (self.base_shift - slope * self.base_seq_len)

    def sigmas(self, steps: int, tokens: int, base: list[float] | None = None) -> torch.Tensor:
        """float32 [len + 1] sigmas ending at 0, from linspace(1, 1/steps) or the given `base` sigmas
        (a refinement pass's). Same numpy float32 arithmetic as the scheduler's set_timesteps."""
        raw = np.linspace(1.0, 1 / steps, steps) if base is None else base
        s = np.array(raw).astype(np.float32)
        if self.dynamic:
            m = self.mu(tokens)
            s = math.exp(m) / (math.exp(m) + (1 / s - 1)) if self.exponential else m / (m + (1 / s - 1))
        else:
            s = self.shift * s / (1 + (self.shift - 1) * s)
        if self.terminal:
            if s[-1] >= 1.0:  # a 1-step schedule: the stretch would divide by zero (NaN in the reference too)
                raise InvalidRequest("num_inference_steps", f"{steps} step cannot reach the scheduler's "
                                                            f"shift_terminal {self.terminal}; use at least 2")
            one_minus = 1 - s
            s = 1 - one_minus / (one_minus[-1] / (1 - self.terminal))
        return torch.cat([torch.from_numpy(np.asarray(s)).to(torch.float32), torch.zeros(1)])
