"""Helios' sigma schedule and solver for the base pipeline (HeliosPipeline + a one-stage HeliosScheduler).

The pipeline passes its own sigmas (linspace 0.999 -> 0, float64), so the scheduler's static `shift` never applies;
with `use_dynamic_shifting` they are time-shifted by mu, which grows with the chunk's token count. The solver is
UniPC (bh2, data prediction, order lowered at the end) or Euler, both on float64 sigmas as the reference keeps them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from vidloom.core.errors import CheckpointError
from vidloom.diffusion.flow_euler import FlowEulerSampler
from vidloom.diffusion.sampler import ConfiguredSampler, SamplerConfig, Schedule
from vidloom.diffusion.unipc import UniPCSampler
from vidloom.loading.config_keys import check_choice, check_class_name
from vidloom.loading.key_policy import KeyPolicy, Refusal

WHERE = "scheduler config"
CLASS_NAME = "HeliosScheduler"
FIRST_SIGMA = 0.999  # HeliosPipeline's sigmas: np.linspace(0.999, 0.0, steps + 1)[:-1]
SOLVERS = ("unipc", "euler")
PYRAMID_STAGES = (2, 3)  # the published 3, and 2 (parity-tested); sizes are multiples of 16 * 2^(stages - 1)
_READ = ("num_train_timesteps", "shift", "stages", "scheduler_type", "solver_order", "disable_corrector",
         "use_dynamic_shifting", "time_shift_type", "base_image_seq_len", "max_image_seq_len", "base_shift",
         "max_shift", "stage_range", "gamma")
SCHEDULER_POLICY = KeyPolicy(
    frozenset(_READ),
    refused={
        "thresholding": Refusal((False,), "dynamic thresholding is not implemented"),
        "prediction_type": Refusal(("flow_prediction",), "Helios predicts flow velocity"),
        "predict_x0": Refusal((True,), "only UniPC's data-prediction form is implemented"),
        "solver_type": Refusal(("bh2", "midpoint", "heun", "logrho"), "only UniPC's B(h) = e^h - 1 is implemented"),
        "lower_order_final": Refusal((True,), "UniPC here always lowers the order at the last steps"),
        "solver_p": Refusal((None,), "an external predictor solver is not supported"),
        "use_flow_sigmas": Refusal((True,), "Helios runs on flow sigmas"),
    },
)


PYRAMID = "pyramid"  # the instance component holding the pipeline's PyramidSettings


@dataclass(frozen=True)
class PyramidSettings:
    """How the program loops: one stage (HeliosPipeline) or the pyramid, with or without CFG-Zero*, or its
    distilled form (DMD steps, no guidance)."""

    enabled: bool
    zero_star: bool
    distilled: bool = False


def calculate_mu(tokens: int, base_len: int, max_len: int, base_shift: float, max_shift: float) -> float:
    """The time shift's mu: linear in the chunk's token count between (base_len, base_shift) and (max_len,
    max_shift), in the reference's operation order (slope, intercept, then the line)."""
    slope = (max_shift - base_shift) / (max_len - base_len)
    return tokens * slope + (base_shift - slope * base_len)


def time_shift(mu: float, sigmas: torch.Tensor, exponential: bool) -> torch.Tensor:
    """HeliosScheduler's time shift by mu; sigma = 0 maps to 0 through 1 / 0 = inf, as in the reference."""
    if exponential:
        return math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1))
    return mu / (mu + (1 / sigmas - 1))


@dataclass(frozen=True)
class HeliosSchedule:
    """The checkpoint's one-stage HeliosScheduler settings (the class's defaults where a key is missing)."""

    num_train_timesteps: int = 1000
    solver: str = "unipc"
    solver_order: int = 2
    disable_corrector: frozenset[int] = frozenset()
    dynamic_shift: bool = False
    exponential: bool = True
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    base_shift: float = 0.5
    max_shift: float = 1.15
    # The pyramid's (HeliosPyramidPipeline): stages, their split of the train range, the renoise correlation, and
    # the static shift of the train sigmas the stages are measured on.
    stages: int = 1
    stage_range: tuple[float, ...] = (0.0, 1.0)
    gamma: float = 1 / 3
    shift: float = 1.0

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any], pyramid: bool = False) -> HeliosSchedule:
        check_class_name(cfg, (CLASS_NAME,), WHERE)
        SCHEDULER_POLICY.check(cfg, WHERE)
        # The class default is 3 stages (the pyramid's); HeliosPipeline itself cannot run them.
        stages = int(cfg.get("stages", 3))
        if pyramid:
            check_choice(stages, "stages", PYRAMID_STAGES, WHERE)
        else:
            check_choice(stages, "stages", (1,), WHERE)
        stage_range = tuple(float(x) for x in cfg.get("stage_range", (0, 1 / 3, 2 / 3, 1)))
        if pyramid and len(stage_range) != stages + 1:
            raise CheckpointError(f"{WHERE}: stage_range has {len(stage_range)} entries; {stages} stages need "
                                  f"{stages + 1}")
        solver = cfg.get("scheduler_type", "unipc")
        check_choice(solver, "scheduler_type", SOLVERS, WHERE)
        kind = cfg.get("time_shift_type", "exponential")
        check_choice(kind, "time_shift_type", ("exponential", "linear"), WHERE)
        dynamic = bool(cfg.get("use_dynamic_shifting", False))
        # HeliosPipeline passes its own sigmas, so a static shift never applies; with the dynamic shift the
        # scheduler asserts it is 1.
        if dynamic and float(cfg.get("shift", 1.0)) != 1.0:
            raise CheckpointError(f"{WHERE}: shift={cfg['shift']!r} with use_dynamic_shifting: HeliosScheduler "
                                  "requires shift 1.0 when it shifts by mu")
        d = cls()
        return cls(
            num_train_timesteps=int(cfg.get("num_train_timesteps", d.num_train_timesteps)),
            solver=str(solver),
            solver_order=int(cfg.get("solver_order", d.solver_order)),
            disable_corrector=frozenset(int(i) for i in cfg.get("disable_corrector") or ()),
            dynamic_shift=dynamic,
            exponential=kind == "exponential",
            base_image_seq_len=int(cfg.get("base_image_seq_len", d.base_image_seq_len)),
            max_image_seq_len=int(cfg.get("max_image_seq_len", d.max_image_seq_len)),
            base_shift=float(cfg.get("base_shift", d.base_shift)),
            max_shift=float(cfg.get("max_shift", d.max_shift)),
            # The one-stage base pipeline reads none of these (it passes its own sigmas): the defaults stand.
            **(dict(stages=stages, stage_range=stage_range, gamma=float(cfg.get("gamma", d.gamma)),
                    shift=float(cfg.get("shift", d.shift))) if pyramid else {}),
        )

    def sampler(self, name: str | None = None) -> ConfiguredSampler:
        """The stateless solver `name` (default: the checkpoint's scheduler_type); each chunk starts a fresh state,
        as the reference resets its solver history per chunk."""
        config = SamplerConfig(num_train_timesteps=self.num_train_timesteps, solver_order=self.solver_order,
                               disable_corrector=self.disable_corrector)
        return UniPCSampler(config) if (name or self.solver) == "unipc" else FlowEulerSampler(config)

    def schedule(self, num_steps: int, chunk_tokens: int) -> Schedule:
        """Sigmas [steps + 1] and timesteps [steps], float64, for a chunk of `chunk_tokens` transformer tokens."""
        base = torch.from_numpy(np.linspace(FIRST_SIGMA, 0.0, num_steps + 1)[:-1].copy())
        sigmas = torch.cat([base, torch.zeros(1, dtype=torch.float64)])
        if not self.dynamic_shift:
            return Schedule(timesteps=base * self.num_train_timesteps, sigmas=sigmas)
        mu = calculate_mu(chunk_tokens, self.base_image_seq_len, self.max_image_seq_len, self.base_shift,
                          self.max_shift)
        shifted = time_shift(mu, sigmas, self.exponential)
        return Schedule(timesteps=shifted[:-1] * self.num_train_timesteps, sigmas=shifted)
