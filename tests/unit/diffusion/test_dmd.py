"""The DMD few-step sampler against its algorithm (there is no diffusers oracle), and the recipe rules
a distilled card imposes: its sampler, its step count, FP8 switched on by its recipe."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.media.request_inputs import resolve_request
from vidloom.diffusion.sampler import SamplerConfig, make_sampler
from vidloom.families.wan.registered import FASTWAN_TIMESTEPS, fastwan21_t2v_1_3b, fastwan21_t2v_1_3b_fp8


def _sampler(steps=FASTWAN_TIMESTEPS):
    return make_sampler("dmd", SamplerConfig(shift=8.0, dmd_timesteps=steps))


def test_one_step_at_sigma_one_with_the_exact_flow_recovers_x0():
    sampler = _sampler((1000,))
    schedule = sampler.schedule(1)
    x0, noise = torch.randn(2, 4, 3, 5), torch.randn(2, 4, 3, 5)
    state = sampler.init_state(schedule)
    out = sampler.step(state, 0, noise - x0, noise)  # at sigma 1 the sample is pure noise
    assert torch.allclose(out, x0, atol=1e-6)


def test_published_step_list_and_renoising_with_the_request_generator():
    sampler = _sampler()
    schedule = sampler.schedule(3)
    assert schedule.timesteps.tolist() == [1000.0, 757.0, 522.0]
    assert schedule.sigmas.tolist() == pytest.approx([1.0, 0.757, 0.522, 0.0])
    x0 = torch.randn(1, 4, 2, 3, 3)
    noise = torch.randn_like(x0)
    state = sampler.init_state(schedule, generator=torch.Generator().manual_seed(5))
    v = torch.randn_like(x0)  # any prediction: the update is x0_hat re-noised to the next sigma
    out = sampler.step(state, 0, v, noise)
    x0_hat = noise - v
    fresh = torch.randn(x0.shape, generator=torch.Generator().manual_seed(5))
    assert torch.allclose(out, (1 - 0.757) * x0_hat + 0.757 * fresh, atol=1e-6)


def test_exact_flow_oracle_lands_on_x0_after_all_steps():
    sampler = _sampler()
    schedule = sampler.schedule(3)
    x0 = torch.randn(1, 4, 2, 3, 3)
    state = sampler.init_state(schedule, generator=torch.Generator().manual_seed(1))
    x = torch.randn_like(x0)
    for index in range(3):
        sigma = schedule.sigmas[index]
        exact = (x - x0) / sigma  # the velocity n - x0 of the noise that is really in x
        x = sampler.step(state, index, exact, x)
    assert torch.allclose(x, x0, atol=1e-5)


def test_step_count_other_than_the_recipe_is_refused():
    with pytest.raises(ValueError, match="3 steps"):
        _sampler().schedule(4)
    with pytest.raises(ValueError, match="distilled timesteps"):
        make_sampler("dmd", SamplerConfig()).schedule(3)


@pytest.mark.parametrize(("changes", "field"), [
    ({"sampler": "unipc"}, "sampler"), ({"num_inference_steps": 8}, "num_inference_steps"),
])
def test_distilled_card_refuses_other_samplers_and_step_counts(changes, field):
    card = fastwan21_t2v_1_3b()
    assert resolve_request(GenerationRequest(prompt="a cat"), card).sampler == "dmd"
    with pytest.raises(InvalidRequest) as err:
        resolve_request(GenerationRequest(prompt="a cat", **changes), card)
    assert err.value.field == field and "dmd-distilled" in err.value.message


def _tiny_fastwan(folder, fp8: bool):
    card = fastwan21_t2v_1_3b_fp8() if fp8 else fastwan21_t2v_1_3b()
    return dataclasses.replace(card, source=str(folder))


def _run(folder, fp8: bool, seed: int) -> np.ndarray:
    from vidloom import registry
    from vidloom.core import plugin
    from vidloom.core.deploy import DeployConfig
    from vidloom.runtime.engine import Engine

    card = _tiny_fastwan(folder, fp8)
    instance = registry.load_instance(card, folder, torch.device("cpu"), None, DeployConfig())
    engine = Engine(instance, plugin.resolve(card.program)(instance))
    request = GenerationRequest(prompt="a red fox", height=32, width=32, num_frames=5, seed=seed)
    return engine.run(request)["video"], instance


def test_same_seed_same_video_and_fp8_from_the_recipe(tiny_wan_dir):
    first, instance = _run(tiny_wan_dir, fp8=False, seed=3)
    again, _ = _run(tiny_wan_dir, fp8=False, seed=3)
    other, _ = _run(tiny_wan_dir, fp8=False, seed=4)
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    assert not instance.deploy.fp8_weights
    quantized, fp8_instance = _run(tiny_wan_dir, fp8=True, seed=3)
    assert fp8_instance.deploy.fp8_weights  # turned on by RecipeSpec.quantization, not by a flag
    from vidloom.layers.fp8 import FP8Linear

    assert any(isinstance(m, FP8Linear) for m in fp8_instance["transformer"].modules())
    assert float(np.abs(quantized - first).max()) < 0.1  # FP8 weights: close to, not equal to, full precision
