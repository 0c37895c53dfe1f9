"""Unit tests for the samplers: schedules, config parsing, registry and per-request state."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from vidloom.core.errors import CheckpointError
from vidloom.diffusion.flow_euler import FlowEulerSampler
from vidloom.diffusion.sampler import SAMPLERS, Sampler, SamplerConfig, Schedule, make_sampler
from vidloom.diffusion.unipc import UniPCSampler
from vidloom.families.wan.demo import WAN21_SCHEDULER

NAMES = sorted(n for n in SAMPLERS if n != "dmd")  # dmd runs only its recipe's steps: tests/unit/diffusion/test_dmd.py


def fake_model(sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
    return torch.tanh(sample * 0.7) + timestep / 1000


def run_loop(sampler: Sampler, num_steps: int, noise: torch.Tensor) -> list[torch.Tensor]:
    schedule = sampler.schedule(num_steps)
    state = sampler.init_state(schedule)
    x, out = noise, []
    for i, t in enumerate(schedule.timesteps):
        x = sampler.step(state, i, fake_model(x, t), x)
        out.append(x)
    return out


def noise(seed: int, shape: tuple[int, ...] = (2, 4, 3, 5, 6)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("num_steps", [1, 2, 7, 50])
def test_schedule_shape_and_end(name: str, num_steps: int) -> None:
    sched = make_sampler(name, SamplerConfig(shift=3.0)).schedule(num_steps)
    assert sched.timesteps.shape == (num_steps,)
    assert sched.sigmas.shape == (num_steps + 1,)
    # Flow-map Euler keeps its reference's float64 grid; the others are float32.
    assert sched.sigmas.dtype == (torch.float64 if name == "flow_map_euler" else torch.float32)
    assert sched.sigmas[-1].item() == 0.0
    assert bool((sched.sigmas[1:] < sched.sigmas[:-1]).all())
    assert sched.sigmas[0].item() <= 1.0


def test_timestep_dtypes() -> None:
    # The model sees these values, so the dtype is part of the contract (see the parity tests).
    assert make_sampler("euler", SamplerConfig()).schedule(4).timesteps.dtype == torch.float32
    unipc = make_sampler("unipc", SamplerConfig()).schedule(4)
    assert unipc.timesteps.dtype == torch.int64
    assert unipc.timesteps[0].item() == 999  # 1000 * (1 - 1e-6), truncated


@pytest.mark.parametrize("shift", [0.5, 3.0, 5.0])
def test_shift_follows_formula(shift: float) -> None:
    def apply(s: np.ndarray) -> np.ndarray:
        return shift * s / (1 + (shift - 1) * s)

    n = 10
    # diffusers' Euler spans its grid down to the already shifted 1/N and then shifts the
    # whole grid, so the lowest sigma is shifted twice.
    euler_base = np.linspace(1, apply(np.array(1 / 1000)), n)
    euler = make_sampler("euler", SamplerConfig(shift=shift)).schedule(n).sigmas[:-1].double().numpy()
    np.testing.assert_allclose(euler, apply(euler_base), atol=1e-6)

    unipc_base = np.linspace(1, 1 / 1000, n + 1)[:-1]
    expected = apply(unipc_base)
    expected[0] -= 1e-6  # UniPC keeps the first sigma off 1 so log(1 - sigma) is finite
    unipc = make_sampler("unipc", SamplerConfig(shift=shift)).schedule(n).sigmas[:-1].double().numpy()
    np.testing.assert_allclose(unipc, expected, atol=1e-6)
    if shift > 1:
        assert (unipc[1:] > unipc_base[1:]).all()  # a shift > 1 spends more steps at high noise


def test_unknown_sampler_lists_known_names() -> None:
    with pytest.raises(ValueError) as err:
        make_sampler("ddim", SamplerConfig())
    for name in SAMPLERS:
        assert name in str(err.value)
    assert "ddim" in str(err.value)


def test_make_sampler_types() -> None:
    assert isinstance(make_sampler("euler", SamplerConfig()), FlowEulerSampler)
    assert isinstance(make_sampler("unipc", SamplerConfig()), UniPCSampler)
    for name in SAMPLERS:
        sampler = make_sampler(name, SamplerConfig())
        assert sampler.name == name
        assert isinstance(sampler, Sampler)


WAN_UNIPC = {**WAN21_SCHEDULER, "flow_shift": 5.0}  # Wan2.1's published scheduler config at the 720p shift


def test_from_diffusers_reads_unipc_and_euler() -> None:
    assert SamplerConfig.from_diffusers(WAN_UNIPC) == SamplerConfig(shift=5.0, solver_order=2)
    no_class = {k: v for k, v in WAN_UNIPC.items() if k != "_class_name"}
    assert SamplerConfig.from_diffusers(no_class).shift == 5.0
    euler = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3}
    cfg = SamplerConfig.from_diffusers(euler)
    assert cfg == SamplerConfig(shift=3.0) and isinstance(cfg.shift, float)
    assert SamplerConfig.from_diffusers({"shift": 7.0, "base_shift": 0.5}).shift == 7.0
    disabled = SamplerConfig.from_diffusers({**WAN_UNIPC, "disable_corrector": [0, 3]})
    assert disabled.disable_corrector == frozenset({0, 3})


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"prediction_type": "epsilon"}, "prediction_type"),
        ({"use_flow_sigmas": False}, "use_flow_sigmas"),
        ({"use_dynamic_shifting": True}, "use_dynamic_shifting"),
        ({"solver_type": "bh1"}, "solver_type"),
        ({"predict_x0": False}, "predict_x0"),
        ({"final_sigmas_type": "sigma_min"}, "final_sigmas_type"),
        ({"lower_order_final": False}, "lower_order_final"),
        ({"use_karras_sigmas": True}, "use_karras_sigmas"),
        ({"thresholding": True}, "thresholding"),
        ({"some_new_option": 1}, "some_new_option"),
        ({"_class_name": "DDIMScheduler"}, "_class_name"),
    ],
)
def test_from_diffusers_rejects_unipc(patch: dict[str, object], field: str) -> None:
    with pytest.raises(CheckpointError, match=field):
        SamplerConfig.from_diffusers({**WAN_UNIPC, **patch})


def test_from_diffusers_rejects_absent_flow_settings() -> None:
    # diffusers' UniPC defaults are epsilon prediction without flow sigmas: absent means unsupported.
    partial = {k: v for k, v in WAN_UNIPC.items() if k != "prediction_type"}
    with pytest.raises(CheckpointError, match="prediction_type is missing"):
        SamplerConfig.from_diffusers(partial)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"use_dynamic_shifting": True}, "use_dynamic_shifting"),
        ({"invert_sigmas": True}, "invert_sigmas"),
        ({"stochastic_sampling": True}, "stochastic_sampling"),
        ({"shift_terminal": 0.1}, "shift_terminal"),
    ],
)
def test_from_diffusers_rejects_euler(patch: dict[str, object], field: str) -> None:
    base = {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0}
    with pytest.raises(CheckpointError, match=field):
        SamplerConfig.from_diffusers({**base, **patch})


def test_config_validation_and_with_shift() -> None:
    cfg = SamplerConfig(shift=3.0)
    assert cfg.with_shift(5.0) == SamplerConfig(shift=5.0)
    assert cfg.shift == 3.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.shift = 2.0  # type: ignore[misc]
    for bad in ({"shift": 0.0}, {"solver_order": 0}, {"num_train_timesteps": 0}):
        with pytest.raises(ValueError):
            SamplerConfig(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NAMES)
def test_interleaved_states_match_solo_runs(name: str) -> None:
    sampler = make_sampler(name, SamplerConfig(shift=3.0))
    before = dataclasses.astuple(sampler)
    solo_a = run_loop(sampler, 6, noise(1))
    solo_b = run_loop(sampler, 9, noise(2, (1, 2, 4)))

    # Two requests of different lengths and shapes advance alternately on the same sampler.
    sched_a, sched_b = sampler.schedule(6), sampler.schedule(9)
    state_a, state_b = sampler.init_state(sched_a), sampler.init_state(sched_b)
    xa, xb = noise(1), noise(2, (1, 2, 4))
    for i in range(9):
        if i < 6:
            xa = sampler.step(state_a, i, fake_model(xa, sched_a.timesteps[i]), xa)
            assert torch.equal(xa, solo_a[i])
        xb = sampler.step(state_b, i, fake_model(xb, sched_b.timesteps[i]), xb)
        assert torch.equal(xb, solo_b[i])
    assert dataclasses.astuple(sampler) == before


@pytest.mark.parametrize("name", NAMES)
def test_single_step_lands_on_x0(name: str) -> None:
    sampler = make_sampler(name, SamplerConfig(shift=5.0))
    sched = sampler.schedule(1)
    x = noise(3)
    v = fake_model(x, sched.timesteps[0])
    out = sampler.step(sampler.init_state(sched), 0, v, x)
    # One step to sigma = 0 is x - sigma_0 * v for both first-order updates.
    torch.testing.assert_close(out, x - sched.sigmas[0] * v, rtol=0, atol=1e-6)
    assert torch.isfinite(out).all()


def test_unipc_rejects_out_of_order_steps() -> None:
    sampler = make_sampler("unipc", SamplerConfig())
    state = sampler.init_state(sampler.schedule(4))
    x = noise(0)
    with pytest.raises(ValueError, match="expected step 0"):
        sampler.step(state, 1, x, x)


@pytest.mark.parametrize("name", NAMES)
def test_bad_arguments(name: str) -> None:
    sampler = make_sampler(name, SamplerConfig())
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError):
            sampler.schedule(bad)  # type: ignore[arg-type]
    state = sampler.init_state(sampler.schedule(2))
    with pytest.raises(ValueError):
        sampler.step(state, 2, noise(0), noise(0))
    with pytest.raises(ValueError):
        Schedule(timesteps=torch.zeros(3), sigmas=torch.zeros(3))
