"""Helios-Distilled's sampling (HeliosPyramidPipeline with is_distilled and a HeliosDMDScheduler): the pyramid's
stages, each stepped DMD-style: the flow prediction gives x0, and unless it is the stage's last step x0 is
re-noised to the next timestep with the stage's own start point (the noise it began from), not fresh noise.

Parity forces following diffusers' HeliosDMDScheduler step by step (Apache-2.0; NOTICE): each stage's grid of
steps + 1 points cut to its first `steps`, sigmas looked up by the nearest timestep to the truncated one, x0 and
the re-noise in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.errors import CheckpointError
from vidloom.diffusion.sampler import Schedule, check_index
from vidloom.families.helios.options import DMD_SAMPLER
from vidloom.families.helios.pyramid import StageRange, stage_schedule
from vidloom.families.helios.schedule import PYRAMID_STAGES, WHERE, HeliosSchedule
from vidloom.loading.config_keys import check_choice, check_class_name
from vidloom.loading.key_policy import KeyPolicy, Refusal

CLASS_NAME = "HeliosDMDScheduler"
# diffusers keeps keys the class does not declare in its config (warning they "will be ignored"), and the
# pipeline's mu line reads four of them with config.get: a file's base/max keys move mu, so they are read too.
MU_KEYS = ("base_image_seq_len", "max_image_seq_len", "base_shift", "max_shift")
SCHEDULER_POLICY = KeyPolicy(
    frozenset({"num_train_timesteps", "shift", "stages", "stage_range", "gamma", "use_dynamic_shifting",
               "time_shift_type", *MU_KEYS}),
    harmless={"scheduler_type": "HeliosScheduler's solver choice (sglang's configs write `dmd`); "
                                "HeliosDMDScheduler keeps it unread and has one step rule"},
    refused={
        "prediction_type": Refusal(("flow_prediction",), "Helios-Distilled predicts flow velocity"),
        "use_flow_sigmas": Refusal((True,), "Helios runs on flow sigmas"),
    },
)


def dmd_schedule(cfg: Mapping[str, Any]) -> HeliosSchedule:
    """A HeliosDMDScheduler config as the pyramid's HeliosSchedule (the class's defaults where a key is missing:
    3 stages, a linear time shift; the pipeline's for mu's line: 256 / 4096 tokens, 0.5 / 1.15)."""
    check_class_name(cfg, (CLASS_NAME,), WHERE)
    SCHEDULER_POLICY.check(cfg, WHERE)
    stages = int(cfg.get("stages", 3))
    check_choice(stages, "stages", PYRAMID_STAGES, WHERE)
    stage_range = tuple(float(x) for x in cfg.get("stage_range", (0, 1 / 3, 2 / 3, 1)))
    if len(stage_range) != stages + 1:
        raise CheckpointError(f"{WHERE}: stage_range has {len(stage_range)} entries; {stages} stages need "
                              f"{stages + 1}")
    kind = cfg.get("time_shift_type", "linear")
    check_choice(kind, "time_shift_type", ("exponential", "linear"), WHERE)
    dynamic = bool(cfg.get("use_dynamic_shifting", False))
    shift = float(cfg.get("shift", 1.0))
    if dynamic and shift != 1.0:  # the scheduler asserts it before shifting by mu
        raise CheckpointError(f"{WHERE}: shift={shift!r} with use_dynamic_shifting: HeliosDMDScheduler requires "
                              "shift 1.0 when it shifts by mu")
    d = HeliosSchedule()
    return replace(d, num_train_timesteps=int(cfg.get("num_train_timesteps", 1000)), solver=DMD_SAMPLER,
                   dynamic_shift=dynamic, exponential=kind == "exponential", stages=stages,
                   stage_range=stage_range, gamma=float(cfg.get("gamma", 1 / 3)), shift=shift,
                   base_image_seq_len=int(cfg.get("base_image_seq_len", d.base_image_seq_len)),
                   max_image_seq_len=int(cfg.get("max_image_seq_len", d.max_image_seq_len)),
                   base_shift=float(cfg.get("base_shift", d.base_shift)),
                   max_shift=float(cfg.get("max_shift", d.max_shift)))


def dmd_stage_schedule(schedule: HeliosSchedule, stage: StageRange, num_steps: int, tokens: int) -> Schedule:
    """One stage's DMD steps: the pyramid's grid over num_steps + 1 points, less its last timestep and its last
    nonzero sigma (HeliosDMDScheduler.set_timesteps)."""
    full = stage_schedule(schedule, stage, num_steps + 1, tokens)
    return Schedule(timesteps=full.timesteps[:-1], sigmas=torch.cat([full.sigmas[:-2], full.sigmas[-1:]]))


@dataclass
class DMDStageState:
    """One stage's run: its schedule and its start point, the latents its first step is given."""

    schedule: Schedule
    start: Tensor | None = None


class HeliosDMDSampler:
    """x0 = x - sigma * v; then x = (1 - sigma') * x0 + sigma' * start until the stage's last step, which returns
    x0. A fresh state per stage (init_state); its first step records the start point."""

    name = DMD_SAMPLER

    def init_state(self, schedule: Schedule, start: int = 0, generator: torch.Generator | None = None) -> DMDStageState:
        check_index(schedule, start)
        return DMDStageState(schedule)

    def step(self, state: DMDStageState, index: int, model_output: Tensor, sample: Tensor) -> Tensor:
        # HeliosDMDScheduler.step term for term (its float64 x0 and re-noise), as parity requires.
        check_index(state.schedule, index)
        if index == 0:
            state.start = sample
        assert state.start is not None, "a DMD stage starts at its step 0"
        x0 = (sample.double() - self._sigma(state.schedule, index) * model_output.double()).to(model_output.dtype)
        if index == state.schedule.num_steps - 1:
            return x0.float()
        following = self._sigma(state.schedule, index + 1)
        return ((1 - following) * x0.double() + following * state.start.double()).to(state.start.dtype)

    @staticmethod
    def _sigma(schedule: Schedule, index: int) -> Tensor:
        """The sigma of step `index` as the reference finds it: at the timestep nearest the truncated one."""
        truncated = float(int(schedule.timesteps[index].item()))
        nearest = torch.argmin((schedule.timesteps.double() - truncated).abs())
        return schedule.sigmas[nearest].double()
