"""LTX-2's sigma schedule vs diffusers' FlowMatchEulerDiscreteScheduler as LTX2Pipeline drives it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.helpers.ltx2_checkpoints import SCHEDULER
from vidloom.core.errors import CheckpointError
from vidloom.families.ltx2.schedule import LTX2Schedule
from vidloom.families.ltx2.settings import STAGE_2_SIGMAS


def _reference(config: dict, steps: int, tokens: int, sigmas: list[float] | None = None) -> torch.Tensor:
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

    scheduler = FlowMatchEulerDiscreteScheduler(**config)
    base = np.linspace(1.0, 1 / steps, steps) if sigmas is None else sigmas
    mu = calculate_shift(tokens, config.get("base_image_seq_len", 1024), config.get("max_image_seq_len", 4096),
                         config.get("base_shift", 0.95), config.get("max_shift", 2.05))
    scheduler.set_timesteps(sigmas=base, mu=mu)
    return scheduler.sigmas


@pytest.mark.parametrize("steps,tokens", [(2, 6), (30, 6144), (40, 1536)])
def test_stage1_sigmas_match_the_pipeline(steps, tokens):
    from diffusers import FlowMatchEulerDiscreteScheduler

    # The reference's whole config, every key as save_pretrained writes it to scheduler_config.json.
    full = dict(FlowMatchEulerDiscreteScheduler(**SCHEDULER).config)
    ours = LTX2Schedule.from_diffusers(full).sigmas(steps, tokens)
    assert torch.equal(ours, _reference(SCHEDULER, steps, tokens))


def test_stage2_sigmas_are_used_as_given():
    config = {**SCHEDULER, "use_dynamic_shifting": False, "shift_terminal": None}
    stage2 = dataclasses.replace(LTX2Schedule.from_diffusers(SCHEDULER), dynamic=False, terminal=None)
    ours = stage2.sigmas(0, 100, list(STAGE_2_SIGMAS))
    assert torch.equal(ours, _reference(config, 3, 100, list(STAGE_2_SIGMAS)))
    assert torch.allclose(ours[:-1], torch.tensor(STAGE_2_SIGMAS))


def test_unsupported_scheduler_setting_is_named():
    with pytest.raises(CheckpointError, match="use_karras_sigmas=True is not supported: a sigma spacing"):
        LTX2Schedule.from_diffusers({**SCHEDULER, "use_karras_sigmas": True})
