"""Parity of our flow-matching samplers with the diffusers schedulers Wan2.1 checkpoints configure."""

from __future__ import annotations

from typing import Any

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from vidloom.diffusion.sampler import Sampler, SamplerConfig, make_sampler  # noqa: E402
from vidloom.families.wan.demo import WAN21_SCHEDULER  # noqa: E402

# Same float32 arithmetic on both sides; the order of operations may differ, which
# could move a result by an ulp or so, far below this bound.
TOL = 1e-6

# Wan2.1's scheduler/scheduler_config.json, verbatim (the demo's); tests change only the shift (3.0 for 480p, 5.0 for 720p).
WAN_UNIPC_JSON: dict[str, Any] = WAN21_SCHEDULER

STEPS = [1, 2, 4, 7, 20]
SHIFTS = [1.0, 3.0, 5.0]


def reference(name: str, shift: float, **unipc_kwargs: Any) -> Any:
    if name == "euler":
        return diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    cfg = {**WAN_UNIPC_JSON, "flow_shift": shift, **unipc_kwargs}
    return diffusers.UniPCMultistepScheduler.from_config(cfg)


def fake_model(sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
    # Depends on both inputs so a wrong timestep or a drifted sample shows up downstream.
    return torch.tanh(sample.float() * 0.7) + timestep / 1000


def assert_same_schedule(ours: Sampler, ref: Any, num_steps: int) -> None:
    ref.set_timesteps(num_steps)
    sched = ours.schedule(num_steps)
    assert sched.timesteps.dtype == ref.timesteps.dtype
    assert torch.equal(sched.timesteps, ref.timesteps), (sched.timesteps, ref.timesteps)
    assert sched.sigmas.dtype == ref.sigmas.dtype
    assert torch.equal(sched.sigmas, ref.sigmas), (sched.sigmas, ref.sigmas)


def assert_same_loop(
    ours: Sampler,
    ref: Any,
    num_steps: int,
    sample_dtype: torch.dtype = torch.float32,
    output_dtype: torch.dtype = torch.float32,
) -> float:
    """Drive both from the same noise, each on its own outputs; return the worst step diff."""
    ref.set_timesteps(num_steps)
    sched = ours.schedule(num_steps)
    state = ours.init_state(sched)
    noise = torch.randn(2, 4, 3, 5, 6, generator=torch.Generator().manual_seed(num_steps))
    x_ours = x_ref = noise.to(sample_dtype)
    worst = 0.0
    for i, t in enumerate(ref.timesteps):
        x_ours = ours.step(state, i, fake_model(x_ours, sched.timesteps[i]).to(output_dtype), x_ours)
        x_ref = ref.step(fake_model(x_ref, t).to(output_dtype), t, x_ref, return_dict=False)[0]
        assert x_ours.dtype == x_ref.dtype
        diff = (x_ours.double() - x_ref.double()).abs().max().item()
        assert diff <= TOL, f"step {i}: max abs diff {diff}"
        worst = max(worst, diff)
    return worst


@pytest.mark.parametrize("name", ["euler", "unipc"])
@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("num_steps", STEPS)
def test_schedule_and_loop_match(name: str, shift: float, num_steps: int) -> None:
    ours = make_sampler(name, SamplerConfig(shift=shift))
    assert_same_schedule(ours, reference(name, shift), num_steps)
    assert_same_loop(ours, reference(name, shift), num_steps)


@pytest.mark.parametrize("shift", [3.0, 5.0])
@pytest.mark.parametrize("num_steps", [1, 4, 50])
def test_wan_json_unipc(shift: float, num_steps: int) -> None:
    # Both sides configured from the checkpoint file, as the runtime and diffusers' WanPipeline do.
    cfg = {**WAN_UNIPC_JSON, "flow_shift": shift}
    ref = diffusers.UniPCMultistepScheduler.from_config(cfg)
    ours = make_sampler("unipc", SamplerConfig.from_diffusers(cfg))
    assert_same_schedule(ours, ref, num_steps)
    assert_same_loop(ours, ref, num_steps)


@pytest.mark.parametrize("shift", [3.0, 5.0])
def test_euler_from_diffusers_config(shift: float) -> None:
    ref = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    ours = make_sampler("euler", SamplerConfig.from_diffusers(dict(ref.config)))
    assert_same_schedule(ours, ref, 30)
    assert_same_loop(ours, ref, 30)


def test_diffusers_saved_unipc_config_is_accepted() -> None:
    # A config re-saved by diffusers carries every init argument, including newer ones.
    ref = reference("unipc", 3.0)
    assert SamplerConfig.from_diffusers(dict(ref.config)) == SamplerConfig(shift=3.0)


@pytest.mark.parametrize(
    "kwargs", [{"solver_order": 1}, {"solver_order": 3}, {"disable_corrector": [0, 2, 5]}]
)
def test_unipc_other_orders_and_disabled_corrector(kwargs: dict[str, Any]) -> None:
    cfg = {**WAN_UNIPC_JSON, **kwargs}
    ours = make_sampler("unipc", SamplerConfig.from_diffusers(cfg))
    for num_steps in (1, 3, 12):
        assert_same_loop(ours, diffusers.UniPCMultistepScheduler.from_config(cfg), num_steps)


@pytest.mark.parametrize(
    ("sample_dtype", "output_dtype"),
    [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16)],
)
def test_low_precision_dtypes_match_unipc(sample_dtype: torch.dtype, output_dtype: torch.dtype) -> None:
    # WanPipeline keeps float32 latents with a bf16 transformer; UniPC returns the sample's dtype.
    ours = make_sampler("unipc", SamplerConfig(shift=5.0))
    assert_same_loop(ours, reference("unipc", 5.0), 7, sample_dtype, output_dtype)


@pytest.mark.parametrize("sample_dtype", [torch.float32, torch.bfloat16])
def test_low_precision_euler_is_diffusers_without_its_cast_to_the_model_dtype(sample_dtype: torch.dtype) -> None:
    # diffusers' Euler casts each new sample to the model output's dtype (bf16 latents every step);
    # ours keeps float32 state like UniPC (vidloom/diffusion/flow_euler.py says why). Fed the same
    # sample at every step, ours rounded to bf16 must equal diffusers' result bit for bit.
    ours = make_sampler("euler", SamplerConfig(shift=5.0))
    ref = reference("euler", 5.0)
    ref.set_timesteps(7)
    sched = ours.schedule(7)
    state = ours.init_state(sched)
    x = torch.randn(2, 4, 3, 5, 6, generator=torch.Generator().manual_seed(7)).to(sample_dtype)
    for i, t in enumerate(ref.timesteps):
        velocity = fake_model(x, t).to(torch.bfloat16)
        x_ours = ours.step(state, i, velocity, x)
        x_ref = ref.step(velocity, t, x, return_dict=False)[0]
        assert x_ours.dtype == torch.float32 and x_ref.dtype == torch.bfloat16
        assert torch.equal(x_ours.to(torch.bfloat16), x_ref), f"step {i}"
        x = x_ref
