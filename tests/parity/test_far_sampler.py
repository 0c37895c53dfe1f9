"""Parity of our flow-map Euler sampler with diffusers' FlowMapEulerDiscreteScheduler."""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from vidloom.core.errors import CheckpointError  # noqa: E402
from vidloom.diffusion.flow_map_euler import FlowMapEulerSampler  # noqa: E402
from vidloom.diffusion.sampler import SamplerConfig, make_sampler  # noqa: E402

STEPS = [1, 2, 4, 7]
SHIFTS = [1.0, 3.0, 5.0]


def fake_flow_map(sample: torch.Tensor, t: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    # Depends on sample and both ends of the interval, so a wrong r or a drifted sample shows.
    return torch.tanh(sample * 0.7) + (t.float() - 0.5 * r.float()) / 1000


def _reference_rollout(num_steps: int, shift: float, x: torch.Tensor) -> list[torch.Tensor]:
    sched = diffusers.FlowMapEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    sched.set_timesteps(num_steps)
    out = []
    for i, t in enumerate(sched.timesteps):
        # As AnyFlowFARPipeline does: r is the next sigma scaled to timesteps.
        r = sched.sigmas[i + 1] * sched.config.num_train_timesteps
        x = sched.step(fake_flow_map(x, t, r), t, x, return_dict=False)[0]
        out.append(x)
    return out


def _our_rollout(num_steps: int, shift: float, x: torch.Tensor) -> list[torch.Tensor]:
    sampler = make_sampler("flow_map_euler", SamplerConfig(shift=shift))
    assert isinstance(sampler, FlowMapEulerSampler)
    schedule = sampler.schedule(num_steps)
    state = sampler.init_state(schedule)
    out = []
    for i, t in enumerate(schedule.timesteps):
        r = sampler.target_timestep(schedule, i)
        x = sampler.step(state, i, fake_flow_map(x, t, r), x)
        out.append(x)
    return out


@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("num_steps", STEPS)
def test_schedule_matches_reference_exactly(num_steps: int, shift: float) -> None:
    ref = diffusers.FlowMapEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    ref.set_timesteps(num_steps)
    ours = make_sampler("flow_map_euler", SamplerConfig(shift=shift)).schedule(num_steps)
    assert ours.timesteps.dtype == ref.timesteps.dtype == torch.float64
    assert torch.equal(ours.timesteps, ref.timesteps)
    assert torch.equal(ours.sigmas, ref.sigmas)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("num_steps", STEPS)
def test_rollout_matches_reference_exactly(num_steps: int, shift: float, dtype: torch.dtype) -> None:
    x = torch.randn(2, 4, 3, 5, 6, generator=torch.Generator().manual_seed(num_steps)).to(dtype)
    expected = _reference_rollout(num_steps, shift, x)
    got = _our_rollout(num_steps, shift, x)
    for step, (a, b) in enumerate(zip(got, expected)):
        assert a.dtype == b.dtype == dtype
        assert torch.equal(a, b), f"step {step}: max abs diff {(a.float() - b.float()).abs().max():.3e}"


def test_config_reads_flow_map_scheduler_json() -> None:
    sched = diffusers.FlowMapEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0)
    config = SamplerConfig.from_diffusers(dict(sched.config))
    assert config == SamplerConfig(num_train_timesteps=1000, shift=5.0)
    with pytest.raises(CheckpointError, match="stochastic"):
        SamplerConfig.from_diffusers({**sched.config, "stochastic": True})
