"""Helios-Distilled's DMD path: its scheduler keys, each stage's steps against HeliosDMDScheduler.set_timesteps,
the step rule, and the card's refusal of guidance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vidloom.core.errors import CheckpointError, InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.core.request_blocks import refuse_unread
from vidloom.families.helios.cards import DISTILLED_DEFAULTS, GEOMETRY, helios_card
from vidloom.families.helios.dmd import HeliosDMDSampler, dmd_schedule, dmd_stage_schedule
from vidloom.families.helios.pyramid import stage_ranges

DMD = {"_class_name": "HeliosDMDScheduler", "num_train_timesteps": 1000, "prediction_type": "flow_prediction",
       "use_flow_sigmas": True}


@pytest.mark.parametrize("cfg,match", [
    ({"solver_order": 2}, "solver_order"),  # HeliosScheduler's key: not this class's
    ({"prediction_type": "epsilon"}, "prediction_type"),
    ({"stages": 1}, "stages"),
    ({"stages": 3, "stage_range": [0, 0.5, 1]}, "stage_range"),
    ({"use_dynamic_shifting": True, "shift": 3.0}, "shift"),
    ({"time_shift_type": "cubic"}, "time_shift_type"),
])
def test_the_dmd_scheduler_keys_are_read_or_refused_by_name(cfg, match):
    with pytest.raises(CheckpointError, match=match):
        dmd_schedule({**DMD, **cfg})


@pytest.mark.parametrize("cfg", [
    dict(stages=3, use_dynamic_shifting=True, time_shift_type="linear"),
    dict(stages=3, use_dynamic_shifting=True, time_shift_type="exponential", gamma=0.25),
    dict(stages=2, stage_range=[0, 0.5, 1], shift=3.0),
    # Keys the class does not declare but keeps in its config, where the pipeline's mu line reads them.
    dict(stages=3, use_dynamic_shifting=True, scheduler_type="dmd", base_image_seq_len=128, max_shift=1.4),
])
@pytest.mark.parametrize("steps,amplify", [(2, False), (3, True), (1, False)])
def test_each_stage_steps_as_the_reference_sets_them(cfg, steps, amplify):
    from diffusers import HeliosDMDScheduler

    theirs = HeliosDMDScheduler.from_config(cfg)
    schedule = dmd_schedule({**DMD, **cfg})
    tokens = 1234  # mu's token count (the dynamic shift's), on the pipeline's line through the config's keys
    lo, hi = theirs.config.get("base_image_seq_len", 256), theirs.config.get("max_image_seq_len", 4096)
    low, high = theirs.config.get("base_shift", 0.5), theirs.config.get("max_shift", 1.15)
    mu = tokens * (high - low) / (hi - lo) + (low - (high - low) / (hi - lo) * lo)
    for stage, bounds in enumerate(stage_ranges(schedule)):
        theirs.set_timesteps(steps, stage, mu=mu, is_amplify_first_chunk=amplify)
        ours = dmd_stage_schedule(schedule, bounds, 2 * steps if amplify else steps, tokens)
        np.testing.assert_allclose(ours.timesteps.numpy(), theirs.timesteps.numpy(), rtol=0, atol=1e-9)
        np.testing.assert_allclose(ours.sigmas.numpy(), theirs.sigmas.numpy(), rtol=0, atol=1e-12)


def test_a_step_renoises_toward_the_stage_start_and_the_last_returns_x0():
    schedule = dmd_stage_schedule(dmd_schedule({**DMD, "stages": 3}), stage_ranges(dmd_schedule(DMD))[0], 2, 0)
    sampler = HeliosDMDSampler()
    state = sampler.init_state(schedule)
    start, flow = torch.randn(1, 4, 2, 4, 4), torch.randn(1, 4, 2, 4, 4)
    first = sampler.step(state, 0, flow, start)
    x0 = start - schedule.sigmas[0].item() * flow
    sigma = schedule.sigmas[1].item()
    torch.testing.assert_close(first, (1 - sigma) * x0 + sigma * start, rtol=0, atol=1e-6)
    last = sampler.step(state, 1, flow, first)
    torch.testing.assert_close(last, first - sigma * flow, rtol=0, atol=1e-6)


def test_the_distilled_card_refuses_guidance_and_a_negative_prompt():
    card = helios_card("helios-distilled", "x", DISTILLED_DEFAULTS, geometry=GEOMETRY, distilled=True)
    refuse_unread(GenerationRequest(prompt="p", guidance_scale=1.0), card)  # its default: taken
    for field, value in (("guidance_scale", 5.0), ("negative_prompt", "blurry")):
        with pytest.raises(InvalidRequest) as err:
            refuse_unread(GenerationRequest(prompt="p", **{field: value}), card)
        assert err.value.field == field
