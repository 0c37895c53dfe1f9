"""Qwen-Image's sigma schedule: linear sigmas, an exponential time shift whose mu grows with the image's token
count, optionally stretched to a terminal sigma (QwenImagePipeline + FlowMatchEulerDiscreteScheduler)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.loading.config_keys import check_class_name
from vidloom.loading.key_policy import KeyPolicy, Refusal

_READ = ("num_train_timesteps", "use_dynamic_shifting", "time_shift_type", "base_shift", "max_shift",
         "base_image_seq_len", "max_image_seq_len", "shift_terminal")
SCHEDULER_POLICY = KeyPolicy(
    frozenset(_READ),
    harmless={"shift": "the pipeline passes mu with use_dynamic_shifting, so the static shift is unused"},
    quiet=frozenset({"shift"}),
    refused={**{key: Refusal((False, None), "a sigma spacing other than the flow-matching linspace, not implemented")
                for key in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas")},
             "invert_sigmas": Refusal((False, None), "reversed sigmas (an editing schedule), not implemented"),
             "stochastic_sampling": Refusal((False, None), "re-noising Euler steps, not implemented")},
)


@dataclass(frozen=True)
class QwenImageSchedule:
    """The checkpoint's scheduler settings (FlowMatchEulerDiscreteScheduler defaults where a key is missing)."""

    num_train_timesteps: int = 1000
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    shift_terminal: float | None = None
    exponential: bool = True

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> QwenImageSchedule:
        check_class_name(cfg, ("FlowMatchEulerDiscreteScheduler",), "scheduler config")
        SCHEDULER_POLICY.check(cfg, "scheduler config")
        if not cfg.get("use_dynamic_shifting", False):
            raise ValueError("scheduler: use_dynamic_shifting must be true for Qwen-Image (the pipeline passes mu)")
        kind = cfg.get("time_shift_type", "exponential")
        if kind not in ("exponential", "linear"):
            raise ValueError(f"scheduler: time_shift_type {kind!r} is not supported")
        d = cls()
        terminal = cfg.get("shift_terminal")
        return cls(
            num_train_timesteps=int(cfg.get("num_train_timesteps", d.num_train_timesteps)),
            base_shift=float(cfg.get("base_shift", d.base_shift)),
            max_shift=float(cfg.get("max_shift", d.max_shift)),
            base_image_seq_len=int(cfg.get("base_image_seq_len", d.base_image_seq_len)),
            max_image_seq_len=int(cfg.get("max_image_seq_len", d.max_image_seq_len)),
            shift_terminal=float(terminal) if terminal else None,
            exponential=kind == "exponential",
        )

    def mu(self, image_seq_len: int) -> float:
        """The shift exponent: linear in the target's token count (the pipeline's calculate_shift)."""
        slope = (self.max_shift - self.base_shift) / (self.max_image_seq_len - self.base_image_seq_len)
        return image_seq_len * slope + (self.base_shift - slope * self.base_image_seq_len)

    def check(self, request: GenerationRequest) -> None:
        """Refuse at submit what the schedule cannot run: one step under a terminal stretch divides 0 by 0 (the
        only sigma is 1, the stretch scales by 1 - sigma; diffusers' scheduler gives NaN latents there)."""
        if self.shift_terminal and request.num_inference_steps < 2:
            raise InvalidRequest("num_inference_steps", f"this scheduler stretches its sigmas to shift_terminal "
                                 f"{self.shift_terminal}, which needs at least 2 steps; got "
                                 f"{request.num_inference_steps}")

    def sigmas(self, steps: int, image_seq_len: int) -> torch.Tensor:
        """float32 [steps + 1] sigmas ending at 0, in the reference's numpy float32 arithmetic (same bits)."""
        mu = self.mu(image_seq_len)
        base = np.linspace(1.0, 1.0 / steps, steps).astype(np.float32)
        if self.exponential:
            shifted = math.exp(mu) / (math.exp(mu) + (1 / base - 1) ** 1.0)
        else:
            shifted = mu / (mu + (1 / base - 1) ** 1.0)
        shifted = np.asarray(shifted)
        if self.shift_terminal:  # stretch so the last sigma is shift_terminal (stretch_shift_to_terminal)
            one_minus = 1 - shifted
            shifted = 1 - one_minus / (one_minus[-1] / (1 - self.shift_terminal))
        return torch.cat([torch.from_numpy(np.asarray(shifted)).to(torch.float32), torch.zeros(1)])
