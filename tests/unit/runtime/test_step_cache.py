"""Step-cache interceptor on a fake staged network: policy decisions, per-branch state, registry."""

from __future__ import annotations

import pytest
import torch

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.core.loop import NETWORK, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import BatchedCFG, SequentialCFG
from vidloom.runtime.step_cache import StepCache, TeaCache, make_step_cache, step_cache_policy

FBCACHE = step_cache_policy("fbcache")


class FakeNet:
    """A staged 'network' whose blocks each add the text value; records which rows ran blocks."""

    num_blocks = 4

    def __init__(self) -> None:
        self.block_rows: list[list[float]] = []  # per block-0 run: the text value of each row

    def embed(self, latents, timestep, text_embeds):
        return latents.clone(), text_embeds

    def run_blocks(self, x, cond, start=0, end=None):
        if start == 0:
            self.block_rows.append(cond[:, 0].tolist())
        for _ in range(start, end if end is not None else self.num_blocks):
            x = x + cond[:, :1]
        return x

    def block_input(self, x, cond, index=0):
        return x + cond[:, :1]

    def head(self, x, cond):
        return x

    def __call__(self, latents, timestep, text_embeds):
        x, cond = self.embed(latents, timestep, text_embeds)
        return self.head(self.run_blocks(x, cond), cond)


def _plans(net, guidance, steps: int, uncond_drift: float):
    """Steps whose cond branch is identical every time and whose uncond text drifts by uncond_drift per step."""
    for i in range(steps):
        yield StepPlan(
            "denoise", i, steps, call=guidance,
            inputs={
                NETWORK: net,
                "latents": torch.ones(1, 3),
                "timestep": torch.tensor([1.0]),
                "prompt_embeds": torch.full((1, 2), 1.0),
                "negative_embeds": torch.full((1, 2), 2.0 + uncond_drift * i),
                "guidance_scale": 3.0,
            },
        )


@pytest.mark.parametrize("policy", [TeaCache(), FBCACHE])
def test_sequential_cfg_keeps_state_per_branch(policy):
    # cond never changes, so it reuses from step 2 on; uncond drifts a lot, so it always computes.
    # With one state shared by both branches, cond would be compared with uncond and never reuse.
    net, cache = FakeNet(), StepCache(policy, threshold=0.05)
    results = [cache.execute(plan) for plan in _plans(net, SequentialCFG(), steps=4, uncond_drift=1.0)]
    assert net.block_rows[:2] == [[1.0], [2.0]]  # step 1: both branches computed
    if policy.name == "teacache":  # block 0 is skipped too: only uncond ran blocks afterwards
        assert net.block_rows[2:] == [[3.0], [4.0], [5.0]]
    # the reused cond branch gives exactly what computing it would have
    plain = [plan.call(**plan.inputs) for plan in _plans(FakeNet(), SequentialCFG(), steps=4, uncond_drift=1.0)]
    for got, want in zip(results, plain):
        assert torch.equal(got, want)
    report = cache.report()["step_cache"]
    assert report["skipped_steps"] == 0 and report["computed_steps"] == 4  # uncond computed every step
    reused_blocks = 4 if policy.name == "teacache" else 3
    assert report["skipped_blocks"] == 3 * reused_blocks and report["total_blocks"] == 4 * 2 * 4


def test_batched_cfg_skips_only_when_every_row_agrees():
    net, cache = FakeNet(), StepCache(TeaCache(), threshold=0.05)
    for plan in _plans(net, BatchedCFG(), steps=3, uncond_drift=1.0):
        cache.execute(plan)
    assert len(net.block_rows) == 3  # the drifting uncond row forces every step to compute
    net, cache = FakeNet(), StepCache(TeaCache(), threshold=0.05)
    for plan in _plans(net, BatchedCFG(), steps=3, uncond_drift=0.0):
        cache.execute(plan)
    assert net.block_rows == [[1.0, 2.0]]  # both rows unchanged: steps 2 and 3 reuse
    report = cache.report()["step_cache"]
    # blocks are counted per row: 3 steps x 4 blocks x 2 rows, of which steps 2 and 3 reused all
    assert (report["skipped_steps"], report["total_blocks"], report["skipped_blocks"]) == (2, 24, 16)


def test_fbcache_measures_block_0s_residual_not_its_output():
    # The tokens grow every step but block 0 adds the same residual: FBCache must reuse from step 2
    # (its output, or output + input, would change by ~1/step and force every step to compute).
    net, cache = FakeNet(), StepCache(FBCACHE, threshold=0.05)
    for i in range(4):
        cache.execute(StepPlan("denoise", i, 4, call=lambda network, latents, timestep, text_embeds: network(
            latents, timestep, text_embeds), inputs={
                NETWORK: net, "latents": torch.full((1, 3), float(i + 1)), "timestep": torch.tensor([1.0]),
                "text_embeds": torch.full((1, 2), 1.0)}))
    assert cache.report()["step_cache"]["skipped_steps"] == 3


def test_threshold_zero_never_skips():
    net, cache = FakeNet(), StepCache(FBCACHE, threshold=0.0)
    for plan in _plans(net, SequentialCFG(), steps=3, uncond_drift=0.0):
        cache.execute(plan)
    assert len(net.block_rows) == 6 and cache.report()["step_cache"]["skipped_blocks"] == 0


def test_plans_without_a_network_run_plainly():
    cache = StepCache(TeaCache(), threshold=1.0)
    assert cache.execute(StepPlan("count", 0, 1, call=lambda x: x + 1, inputs={"x": 1})) == 2


def test_registry_and_thresholds():
    assert step_cache_policy("none") is None
    with pytest.raises(DeployError, match="unknown step_cache 'tea'; known: none, teacache, fbcache, dbcache, quality, balanced, fast"):
        step_cache_policy("tea")
    request = GenerationRequest("p")
    assert make_step_cache(DeployConfig(), request) is None
    assert make_step_cache(DeployConfig(step_cache="fbcache"), request).threshold == FBCACHE.default_threshold
    deployed = DeployConfig(step_cache="teacache", step_cache_threshold=0.2)
    assert make_step_cache(deployed, request).threshold == 0.2
    assert make_step_cache(deployed, GenerationRequest("p", step_cache_threshold=0.0)).threshold == 0.0
    with pytest.raises(InvalidRequest, match="step_cache_threshold: this model is deployed without a step cache"):
        make_step_cache(DeployConfig(), GenerationRequest("p", step_cache_threshold=0.1))
    with pytest.raises(DeployError, match="step_cache_threshold must be >= 0"):
        DeployConfig(step_cache="teacache", step_cache_threshold=-1.0)
