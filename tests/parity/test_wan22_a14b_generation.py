"""End-to-end parity: Wan2.2 A14B-style two-expert denoising (boundary inside the schedule, a guidance
scale per expert) vs diffusers' WanPipeline(transformer_2=..., boundary_ratio=...); idle-expert offload."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.wan22_checkpoints import write_tiny_a14b
from tests.helpers.wan_checkpoints import TINY_A, TINY_B
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.parity import ParityRun, run_parity

TOLERANCE = 1e-4  # as the Wan2.1 parity tests (fp32 CPU)
PROMPT = "a red fox jumps over a frozen river"
NEGATIVE = "blurred, low quality"
# 6 UniPC steps at shift 5 put timesteps 1000, 961, 909 above the 0.875 boundary and 833, 714, 500 below.
CASES = {
    "nonsquare": dict(height=32, width=48, num_frames=9, steps=6, guidance=5.0, guidance_2=2.5, seed=42),
    "tall-same-scale": dict(height=48, width=16, num_frames=5, steps=6, guidance=4.0, guidance_2=None, seed=7),
}


@pytest.fixture(scope="module", params=[TINY_A, TINY_B], ids=lambda s: s.name)
def a14b_dir(request, tmp_path_factory):
    return write_tiny_a14b(tmp_path_factory.mktemp(f"a14b-{request.param.name}"), request.param)


def _request(shift: float = 5.0, **kw) -> GenerationRequest:
    return GenerationRequest(
        prompt=PROMPT, negative_prompt=NEGATIVE, height=kw["height"], width=kw["width"],
        num_frames=kw["num_frames"], num_inference_steps=kw["steps"], guidance_scale=kw["guidance"],
        guidance_scale_2=kw["guidance_2"], flow_shift=shift, seed=kw["seed"],
    )


def _ours(gen, shift: float = 5.0, **kw) -> np.ndarray:
    return gen.engine.run(_request(shift, **kw))["video"]


def _compare(folder, gen, shift: float = 5.0, **kw) -> ParityRun:
    """Both sides through the parity tool (both experts tapped): the report names the first diverging
    step, call and block, and says which steps ran which expert by where they diverge."""
    result = run_parity(folder, _request(shift, **kw), generator=gen)
    assert result.reference.pipe.transformer_2 is not None and result.reference.pipe.config.boundary_ratio == 0.875
    return result


@pytest.mark.parametrize("case", list(CASES))
def test_two_experts_match_diffusers(a14b_dir, case):
    kw = CASES[case]
    gen = VideoGenerator.from_pretrained(a14b_dir, device="cpu")
    assert "guidance_scale_2" in gen.card.option_names and gen.card.family == "wan2.2"
    loop = next(node.loop for node in gen.engine.program.nodes if node.loop is not None)
    schedule = loop.sampler_config.with_shift(5.0)
    from vidloom.diffusion.sampler import make_sampler

    timesteps = make_sampler("unipc", schedule).schedule(kw["steps"]).timesteps
    assert [loop.expert_for(t) for t in timesteps] == ["transformer"] * 3 + ["transformer_2"] * 3
    result = _compare(a14b_dir, gen, **kw)
    expected, got, report = result.theirs, result.ours, result.report.format()
    diff = float(np.abs(got - expected).max())
    assert diff <= TOLERANCE, f"{case}: max abs diff {diff:.3e}\n{report}"
    assert expected.std() > 1e-3
    assert result.report.ok, report
    # Both experts' blocks were compared: every step, high-noise and low-noise, has block taps on both sides.
    assert {d.key.step for d in result.report.diffs if d.key.kind == "block"} == set(range(kw["steps"]))
    if kw["guidance_2"] is not None:  # the low-noise expert's own scale must be used
        other = _ours(gen, **{**kw, "guidance_2": kw["guidance"]})
        assert float(np.abs(other - got).max()) > 1e-3


def test_timestep_exactly_on_the_boundary_runs_the_high_noise_expert(a14b_dir):
    # 4 UniPC steps at shift 7 give timesteps 999, 954, 875, 700: the third is exactly 0.875 x 1000, which
    # diffusers gives to the high-noise expert (pipeline_wan.py: `t >= boundary_timestep`). With `>` the step
    # would run transformer_2 at guidance_2, far outside the tolerance.
    kw = dict(height=32, width=32, num_frames=5, steps=4, guidance=5.0, guidance_2=1.5, seed=3)
    gen = VideoGenerator.from_pretrained(a14b_dir, device="cpu")
    loop = next(node.loop for node in gen.engine.program.nodes if node.loop is not None)
    from vidloom.diffusion.sampler import make_sampler

    timesteps = make_sampler("unipc", loop.sampler_config.with_shift(7.0)).schedule(kw["steps"]).timesteps
    assert timesteps.tolist() == [999, 954, 875, 700]
    assert [loop.expert_for(t) for t in timesteps] == ["transformer"] * 3 + ["transformer_2"]
    assert loop.expert_for(torch.tensor(874.999)) == "transformer_2"
    result = _compare(a14b_dir, gen, shift=7.0, **kw)
    diff = float(np.abs(result.ours - result.theirs).max())
    assert diff <= TOLERANCE, f"max abs diff {diff:.3e}\n{result.report.format()}"
    assert result.report.ok, result.report.format()


def test_idle_expert_offload_runs_both_experts_and_keeps_the_result(a14b_dir):
    kw = CASES["nonsquare"]
    plain = _ours(VideoGenerator.from_pretrained(a14b_dir, device="cpu"), **kw)
    gen = VideoGenerator.from_pretrained(a14b_dir, device="cpu", deploy=DeployConfig(offload_idle_expert=True))
    placement = gen.engine.instance["expert_placement"]
    assert placement.resident is None
    got = _ours(gen, **kw)
    assert np.array_equal(got, plain)
    # Both experts ran, one after the other, and only the last one is still "on the device".
    assert placement.uploads == 2 and placement.resident == "transformer_2"
    assert placement.is_resident("transformer_2") and not placement.is_resident("transformer")


def test_offload_with_cuda_graphs_is_refused():
    with pytest.raises(DeployError, match="offload_idle_expert"):
        DeployConfig(offload_idle_expert=True, cuda_graphs=True)


def test_guidance_scale_2_is_refused_by_one_expert_cards(tiny_wan_dir):
    gen = VideoGenerator.from_pretrained(tiny_wan_dir, device="cpu")
    with pytest.raises(InvalidRequest) as err:
        gen.generate(PROMPT, guidance_scale_2=3.0, num_inference_steps=1)
    assert err.value.field == "guidance_scale_2"


def test_step_cache_keeps_residuals_per_expert(a14b_dir):
    # A threshold no change reaches: every step after an expert's first reuses that expert's residuals,
    # so exactly one step per expert computes; sharing residuals across experts would compute only one.
    deploy = DeployConfig(step_cache="fbcache", step_cache_threshold=1e9)
    gen = VideoGenerator.from_pretrained(a14b_dir, device="cpu", deploy=deploy)
    out = gen.engine.run(GenerationRequest(prompt=PROMPT, height=32, width=32, num_frames=5, num_inference_steps=6,
                                           guidance_scale=1.0, flow_shift=5.0, seed=1))
    assert out["step_cache"]["computed_steps"] == 2 and out["step_cache"]["skipped_steps"] == 4


def test_step_plans_name_the_expert_and_run_the_resident_modules(a14b_dir):
    from vidloom.core.loop import NETWORK, Done
    from vidloom.media.request_inputs import resolve_request

    gen = VideoGenerator.from_pretrained(a14b_dir, device="cpu")
    loop = next(node.loop for node in gen.engine.program.nodes if node.loop is not None)
    request = resolve_request(GenerationRequest(prompt=PROMPT, height=32, width=32, num_frames=5,
                                                num_inference_steps=6, guidance_scale=1.0, flow_shift=5.0), gen.card)
    z = gen.engine.instance["vae"].config.z_dim
    state = loop.init({"request": request, "latents": torch.zeros(1, z, 2, 4, 4),
                       "prompt_embeds": torch.zeros(1, 512, 32), "negative_embeds": None}, None)  # no runtime context used
    seen = []
    while not isinstance(plan := loop.next(state), Done):
        seen.append(plan.expert)
        assert plan.inputs[NETWORK] is gen.engine.instance[plan.expert]  # one shared resident copy per expert
        state = loop.advance(state, torch.zeros_like(state.latents))
    assert seen == ["transformer"] * 3 + ["transformer_2"] * 3
