"""Flux2's sigma schedule vs diffusers' scheduler fed the way Flux2KleinPipeline feeds it."""

from __future__ import annotations

import numpy as np
import pytest

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from vidloom.core.errors import CheckpointError
from vidloom.families.flux2.schedule import Flux2Schedule, empirical_mu
from tests.helpers.flux2_checkpoints import SCHEDULER


@pytest.mark.parametrize("steps, seq_len", [(1, 96), (4, 4096), (28, 1024), (50, 5000)])
def test_sigmas_equal_the_reference_bit_for_bit(steps, seq_len):
    ref = FlowMatchEulerDiscreteScheduler(**SCHEDULER)
    ref.set_timesteps(steps, sigmas=np.linspace(1.0, 1 / steps, steps), mu=empirical_mu(seq_len, steps))
    # The reference's whole config, every key as save_pretrained writes it to scheduler_config.json.
    ours = Flux2Schedule.from_diffusers({**ref.config, "_class_name": "FlowMatchEulerDiscreteScheduler"})
    assert torch.equal(ours.sigmas(steps, seq_len), ref.sigmas)


@pytest.mark.parametrize("change", [{"use_dynamic_shifting": False}, {"use_karras_sigmas": True},
                                    {"_class_name": "UniPCMultistepScheduler"}])
def test_unsupported_scheduler_settings_are_refused(change):
    with pytest.raises((ValueError, CheckpointError)):  # a refused key value is a CheckpointError naming it
        Flux2Schedule.from_diffusers({**SCHEDULER, **change})
