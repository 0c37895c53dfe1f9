"""Flow-match Euler keeps its state in float32 for half-precision model outputs, like UniPC."""

from __future__ import annotations

import pytest
import torch

from vidloom.diffusion.sampler import SamplerConfig, make_sampler

CONFIG = SamplerConfig(num_train_timesteps=1000, shift=3.0)


@pytest.mark.parametrize("name", ["euler", "unipc"])
def test_sampler_state_stays_float32_with_bf16_model_output(name):
    sampler = make_sampler(name, CONFIG)
    schedule = sampler.schedule(4)
    state = sampler.init_state(schedule)
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 4, 2, 3, 3, generator=gen)
    for i in range(4):
        velocity = torch.randn(latents.shape, generator=gen).bfloat16()
        latents = sampler.step(state, i, velocity, latents)
        assert latents.dtype == torch.float32, f"{name} step {i} returned {latents.dtype}"


def test_euler_update_is_diffusers_update_without_the_final_bf16_cast():
    diffusers = pytest.importorskip("diffusers")
    ref = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    ref.set_timesteps(4)
    sampler = make_sampler("euler", CONFIG)
    state = sampler.init_state(sampler.schedule(4))
    gen = torch.Generator().manual_seed(1)
    sample = torch.randn(1, 4, 2, 3, 3, generator=gen)
    velocity = torch.randn(sample.shape, generator=gen).bfloat16()
    ours = sampler.step(state, 0, velocity, sample)
    theirs = ref.step(velocity, ref.timesteps[0], sample, return_dict=False)[0]
    assert theirs.dtype == torch.bfloat16  # diffusers rounds the latents to the model dtype
    assert ours.dtype == torch.float32
    assert torch.equal(ours.to(torch.bfloat16), theirs)  # same arithmetic, one rounding apart
    assert not torch.equal(ours, theirs.float())  # and that rounding is what we keep
