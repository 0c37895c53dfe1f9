"""Our cosine DPM-solver++ SDE vs diffusers' CosineDPMSolverMultistepScheduler, step for step.

Both are fed the same model outputs (a fixed function of the sample, so a drift would compound) and the same
seed; every setting that changes the update is covered. The updates follow the reference's operation order and
draw the same Brownian-tree noise, so the tolerance is bitwise up to float32 rounding: 1e-6 relative.
"""

from __future__ import annotations

import pytest
import torch

from vidloom.diffusion import cosine_dpm
from vidloom.diffusion.cosine_dpm import CosineDPMConfig

pytest.importorskip("torchsde")

SETTINGS = [
    {},
    {"sigma_schedule": "karras", "solver_type": "heun"},
    {"solver_order": 1},
    {"euler_at_final": True, "prediction_type": "epsilon", "sigma_data": 0.5},
    {"lower_order_final": False, "sigma_max": 80.0, "sigma_min": 0.05},
]


def _model(sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
    return torch.tanh(sample * 0.3 + timestep) * 0.8


@pytest.mark.parametrize("steps", [1, 2, 7, 16])
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default")
def test_steps_match_diffusers(settings, steps):
    from diffusers import CosineDPMSolverMultistepScheduler

    reference = CosineDPMSolverMultistepScheduler(**settings)
    reference.set_timesteps(steps)
    config = CosineDPMConfig.from_diffusers(dict(reference.config))
    state = cosine_dpm.start(config, steps, seed=1234)
    assert torch.equal(state.sigmas, reference.sigmas)
    shape = (1, 3, 10)
    theirs = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * reference.init_noise_sigma
    ours = theirs.clone()
    generator = torch.Generator().manual_seed(1234)
    for t in reference.timesteps:
        scaled = reference.scale_model_input(theirs, t)
        theirs = reference.step(_model(scaled, t), t, theirs, generator=generator).prev_sample
        sigma = state.sigmas[state.index]
        assert torch.equal(config.noise_level(sigma), t)
        mine_scaled = config.scale_input(ours, sigma)
        torch.testing.assert_close(mine_scaled, scaled, rtol=1e-6, atol=1e-6)
        ours = cosine_dpm.step(config, state, _model(mine_scaled, config.noise_level(sigma)), ours)
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-5)
    assert state.index == steps


def test_seed_changes_the_noise():
    config = CosineDPMConfig()
    outs = []
    for seed in (1, 2):
        state = cosine_dpm.start(config, 4, seed)
        x = torch.ones(1, 2, 8)
        for _ in range(4):
            x = cosine_dpm.step(config, state, torch.zeros_like(x), x)
        outs.append(x)
    assert not torch.allclose(outs[0], outs[1])


@pytest.mark.parametrize("key,value", [("solver_order", 3), ("sigma_schedule", "linear"),
                                       ("prediction_type", "sample"), ("final_sigmas_type", "sigma_min")])
def test_unsupported_settings_are_named(key, value):
    with pytest.raises(ValueError, match=key):
        CosineDPMConfig.from_diffusers({key: value})


def test_unknown_keys_and_other_schedulers_are_refused():
    from vidloom.core.errors import CheckpointError

    with pytest.raises(CheckpointError, match="use_karras_sigmas"):
        CosineDPMConfig.from_diffusers({"use_karras_sigmas": True})
    with pytest.raises(ValueError, match="EDMDPMSolverMultistepScheduler"):
        CosineDPMConfig.from_diffusers({"_class_name": "EDMDPMSolverMultistepScheduler"})
