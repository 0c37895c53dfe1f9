"""UniPC parity on Cosmos3's real scheduler config: Karras sigmas over flow sigmas, and the native flow schedule.

Cosmos3-Nano and Cosmos3-Edge ship the same scheduler_config.json (tests/helpers/cosmos3_checkpoints.py,
COSMOS3_NANO_SCHEDULER); both sides are configured from it, as the runtime and Cosmos3OmniPipeline are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from tests.helpers.cosmos3_checkpoints import COSMOS3_NANO_SCHEDULER  # noqa: E402
from vidloom.core.errors import CheckpointError  # noqa: E402
from vidloom.diffusion.sampler import SamplerConfig, make_sampler  # noqa: E402
from vidloom.diffusion.unipc import UniPCSampler  # noqa: E402

# Same float32 arithmetic on both sides in the same order; any drift would be an ulp or so.
TOL = 1e-6
DEFAULT_FLOW = {**COSMOS3_NANO_SCHEDULER, "use_karras_sigmas": False, "flow_shift": 5.0}


def set_reference(ref: Any, num_steps: int, native: bool) -> None:
    """What Cosmos3OmniPipeline does in its step 6, with and without use_native_flow_schedule."""
    if native:
        n = ref.config.num_train_timesteps
        ref.set_timesteps(num_steps, sigmas=np.linspace(1.0 - 1.0 / n, 0.0, num_steps + 1)[:-1])
    else:
        ref.set_timesteps(num_steps)


def fake_model(sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
    # Depends on both inputs so a wrong timestep or a drifted sample shows up downstream.
    return torch.tanh(sample * 0.7) + timestep / 1000


def ours_for(cfg: dict[str, Any], native: bool) -> UniPCSampler:
    config = SamplerConfig.from_diffusers(cfg)
    return make_sampler("unipc", SamplerConfig(**{**config.__dict__, "native_flow_schedule": native}))


@pytest.mark.parametrize("cfg", [COSMOS3_NANO_SCHEDULER, DEFAULT_FLOW], ids=["karras", "flow"])
@pytest.mark.parametrize("native", [False, True], ids=["default", "native"])
@pytest.mark.parametrize("num_steps", [1, 2, 5, 35])
def test_schedule_and_sampling_match(cfg: dict[str, Any], native: bool, num_steps: int) -> None:
    ref = diffusers.UniPCMultistepScheduler.from_config(cfg)
    set_reference(ref, num_steps, native)
    ours = ours_for(cfg, native)
    sched = ours.schedule(num_steps)
    assert sched.timesteps.dtype == ref.timesteps.dtype and torch.equal(sched.timesteps, ref.timesteps)
    assert sched.sigmas.dtype == ref.sigmas.dtype and torch.equal(sched.sigmas, ref.sigmas)

    state = ours.init_state(sched)
    x_ours = x_ref = torch.randn(1, 4, 3, 5, 6, generator=torch.Generator().manual_seed(num_steps))
    for i, t in enumerate(ref.timesteps):
        x_ours = ours.step(state, i, fake_model(x_ours, sched.timesteps[i]), x_ours)
        x_ref = ref.step(fake_model(x_ref, t), t, x_ref, return_dict=False)[0]
        diff = (x_ours - x_ref).abs().max().item()
        assert diff <= TOL, f"step {i}: max abs diff {diff}"


def test_karras_schedule_is_not_the_flow_one() -> None:
    # Guards the test above against comparing two identical schedules: the Karras range moves every sigma.
    karras = ours_for(COSMOS3_NANO_SCHEDULER, False).schedule(35)
    flow = ours_for({**COSMOS3_NANO_SCHEDULER, "use_karras_sigmas": False}, False).schedule(35)
    assert (karras.sigmas[:-1] - flow.sigmas[:-1]).abs().max() > 0.05
    assert karras.sigmas[0].item() == pytest.approx(200 / 201) and karras.sigmas[-2].item() == pytest.approx(
        0.147 / 1.147)


def test_karras_config_is_read() -> None:
    config = SamplerConfig.from_diffusers(COSMOS3_NANO_SCHEDULER)
    assert config.karras_sigmas == (0.147, 200.0) and not config.uses_shift
    # A config re-saved by diffusers (every init argument) reads the same.
    saved = dict(diffusers.UniPCMultistepScheduler.from_config(COSMOS3_NANO_SCHEDULER).config)
    assert SamplerConfig.from_diffusers(saved) == config


@pytest.mark.parametrize("patch", [{"sigma_min": None}, {"sigma_max": None}, {"sigma_max": "200"},
                                   {"sigma_min": 300.0}])
def test_karras_without_a_usable_range_is_refused(patch: dict[str, Any]) -> None:
    with pytest.raises((CheckpointError, ValueError), match="sigma_m"):
        SamplerConfig.from_diffusers({**COSMOS3_NANO_SCHEDULER, **patch})


def test_a_karras_schedule_takes_no_other_shift() -> None:
    config = SamplerConfig.from_diffusers(COSMOS3_NANO_SCHEDULER)
    assert config.with_shift(1.0) == config
    with pytest.raises(ValueError, match="use_karras_sigmas"):
        config.with_shift(3.0)
