"""HunyuanVideo-1.5's schedule and guidance settings: linear sigmas under the scheduler's static shift
(HunyuanVideo15Pipeline + FlowMatchEulerDiscreteScheduler), and the saved ClassifierFreeGuidance guider, which
holds the guidance scale (the pipeline's call takes none)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

from vidloom.loading.config_keys import check_class_name
from vidloom.loading.key_policy import KeyPolicy, Refusal

SCHEDULER_POLICY = KeyPolicy(
    frozenset({"num_train_timesteps", "shift", "use_dynamic_shifting"}),
    harmless={key: "the pipeline passes its own sigmas without mu, so the dynamic-shift settings are unused"
              for key in ("base_shift", "max_shift", "base_image_seq_len", "max_image_seq_len", "time_shift_type")},
    quiet=frozenset({"base_shift", "max_shift", "base_image_seq_len", "max_image_seq_len", "time_shift_type"}),
    refused={**{key: Refusal((False, None), "a sigma spacing other than the flow-matching linspace, not implemented")
                for key in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas")},
             "shift_terminal": Refusal((None, 0, 0.0), "a terminal-sigma stretch, not implemented"),
             "invert_sigmas": Refusal((False, None), "reversed sigmas (an editing schedule), not implemented"),
             "stochastic_sampling": Refusal((False, None), "re-noising Euler steps, not implemented")},
)
GUIDER_POLICY = KeyPolicy(
    frozenset({"guidance_scale", "guidance_rescale", "use_original_formulation", "start", "stop", "enabled"}),
)


@dataclass(frozen=True)
class Hunyuan15Schedule:
    """The checkpoint's scheduler settings (FlowMatchEulerDiscreteScheduler defaults where a key is missing)."""

    num_train_timesteps: int = 1000
    shift: float = 1.0

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> Hunyuan15Schedule:
        check_class_name(cfg, ("FlowMatchEulerDiscreteScheduler",), "scheduler config")
        SCHEDULER_POLICY.check(cfg, "scheduler config")
        if cfg.get("use_dynamic_shifting", False):
            raise ValueError("scheduler: use_dynamic_shifting needs mu, which HunyuanVideo15Pipeline never passes")
        return cls(num_train_timesteps=int(cfg.get("num_train_timesteps", 1000)), shift=float(cfg.get("shift", 1.0)))

    def sigmas(self, steps: int, shift: float | None = None) -> Tensor:
        """float32 [steps + 1] sigmas ending at 0: linspace(1, 0) without its end, shifted in the reference's numpy
        float32 arithmetic (same bits); `shift` overrides the checkpoint's."""
        s = self.shift if shift is None else shift
        base = np.linspace(1.0, 0.0, steps + 1)[:-1].astype(np.float32)
        shifted = s * base / (1 + (s - 1) * base)
        return torch.cat([torch.from_numpy(np.asarray(shifted, dtype=np.float32)), torch.zeros(1)])


@dataclass(frozen=True)
class Hunyuan15Guider:
    """The saved guider (guider/guider_config.json, ClassifierFreeGuidance): the scale, an optional std rescale,
    and the fraction of steps [start, stop) that run CFG."""

    guidance_scale: float = 7.5
    guidance_rescale: float = 0.0
    use_original_formulation: bool = False
    start: float = 0.0
    stop: float = 1.0
    enabled: bool = True

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> Hunyuan15Guider:
        check_class_name(cfg, ("ClassifierFreeGuidance",), "guider config")
        GUIDER_POLICY.check(cfg, "guider config")
        d = cls()
        return cls(guidance_scale=float(cfg.get("guidance_scale", d.guidance_scale)),
                   guidance_rescale=float(cfg.get("guidance_rescale", d.guidance_rescale)),
                   use_original_formulation=bool(cfg.get("use_original_formulation", d.use_original_formulation)),
                   start=float(cfg.get("start", d.start)), stop=float(cfg.get("stop", d.stop)),
                   enabled=bool(cfg.get("enabled", d.enabled)))

    def cfg_at(self, step: int, steps: int, scale: float) -> bool:
        """Whether step `step` of `steps` runs both branches at guidance `scale` (the guider's _is_cfg_enabled)."""
        if not self.enabled or not int(self.start * steps) <= step < int(self.stop * steps):
            return False
        return not math.isclose(scale, 0.0 if self.use_original_formulation else 1.0)

    def combine(self, cond: Tensor, uncond: Tensor, scale: float | Tensor) -> Tensor:
        """The guided prediction, rescaled toward the conditional one's std when guidance_rescale > 0. A float32
        tensor scale (a captured step's 0-dim buffer, or per-sample scales of a batch) multiplies in float32 and
        rounds once to the activations' dtype, as a Python float does (diffusion.guidance.cfg_combine): graphed
        and eager steps compute the same bits."""
        diff = cond - uncond
        step = (scale.float() * diff.float()).to(diff.dtype) if isinstance(scale, Tensor) else scale * diff
        pred = (cond if self.use_original_formulation else uncond) + step
        if self.guidance_rescale > 0:
            dims = list(range(1, cond.ndim))
            rescaled = pred * (cond.std(dim=dims, keepdim=True) / pred.std(dim=dims, keepdim=True))
            pred = self.guidance_rescale * rescaled + (1 - self.guidance_rescale) * pred
        return pred
