"""DBCache decisions on a fake staged network whose front-block residual follows a chosen sequence.

Rules (cache-dit v1.5.3, CachedContextManager.can_cache): warm-up steps compute; a step mask's 1 steps compute
and, static, its 0 steps cache unmeasured; then max cached / max continuous cached steps; then the relative L1
change of the Fn residual since the last computed step against the threshold.
"""

from __future__ import annotations

import pytest
import torch

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.core.loop import NETWORK, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.runtime.dbcache import DBCache, DBCacheSettings
from vidloom.runtime.step_cache import StepCache, deployed_policy, make_step_cache


class RampNet:
    """Every block adds the row's value: the Fn residual is Fn x value, so its change is the value's."""

    def __init__(self, num_blocks: int = 4) -> None:
        self.num_blocks = num_blocks
        self.ranges: list[tuple[int, int]] = []  # block ranges run, in order

    def embed(self, latents, values):
        return latents.clone(), values

    def run_blocks(self, x, cond, start=0, end=None):
        end = self.num_blocks if end is None else end
        self.ranges.append((start, end))
        for _ in range(start, end):
            x = x + cond
        return x

    def block_input(self, x, cond, index=0):
        return x

    def head(self, x, cond):
        return x

    def __call__(self, latents, values):
        x, cond = self.embed(latents, values)
        return self.head(self.run_blocks(x, cond), cond)


def _run(policy: DBCache, values: list[float], threshold: float = 0.1, net: RampNet | None = None):
    """Run one branch over steps whose block value is values[i]; return (cache, outputs, net)."""
    net = net or RampNet()
    cache = StepCache(policy, threshold)
    outs = [cache.execute(StepPlan("denoise", i, len(values), call=lambda network, latents, values: network(
        latents, values), inputs={NETWORK: net, "latents": torch.zeros(1, 2), "values": torch.full((1, 1), v)}))
        for i, v in enumerate(values)]
    return cache, outs, net


def _cached(cache: StepCache) -> list[int]:
    (branch,) = cache._branches.values()
    return branch.cached_steps


def _policy(**settings) -> DBCache:
    return DBCache("dbcache", DBCacheSettings(**{"fn": 1, "bn": 0, "warmup": 1, **settings}), 0.1)


STEADY = [1.0] * 7  # the residual never changes: every step past the limits caches


def test_warmup_steps_compute_then_a_steady_residual_caches():
    assert _cached(_run(_policy(warmup=3), STEADY)[0]) == [3, 4, 5, 6]


def test_change_is_measured_against_the_last_computed_step_so_drift_adds_up():
    # +4% per step: 1.04 caches (0.04 < 0.1), 1.08 too, 1.12 is 12% from step 0's 1.0: computes and re-anchors.
    values = [1.0, 1.04, 1.08, 1.12, 1.16, 1.2]
    assert _cached(_run(_policy(), values)[0]) == [1, 2, 4, 5]


@pytest.mark.parametrize("settings, expected", [
    (dict(max_continuous=2), [1, 2, 4, 5]),  # a computed step ends each streak of two
    (dict(max_cached=2), [1, 2]),
    (dict(mask=(1, 0, 1, 0, 0, 1)), [1, 3, 4, 6]),  # past the mask's end the threshold decides
])
def test_limits_and_masks(settings, expected):
    assert _cached(_run(_policy(**settings), STEADY)[0]) == expected


def test_static_mask_caches_its_zero_steps_even_when_the_residual_changes():
    changing = [1.0, 2.0, 4.0, 8.0, 16.0]
    mask = (1, 0, 1, 0, 1)
    assert _cached(_run(_policy(mask=mask), changing)[0]) == []  # dynamic: the threshold still says no
    assert _cached(_run(_policy(mask=mask, mask_static=True), changing)[0]) == [1, 3]


def test_warmup_ends_with_the_masks_leading_compute_steps():
    # cache-dit truncates the warm-up to the mask's leading 1s: step 2 may cache despite warmup=5.
    assert _cached(_run(_policy(warmup=5, mask=(1, 1, 0, 0)), STEADY[:4])[0]) == [2, 3]


def test_front_and_back_blocks_run_every_step_and_the_middle_is_reused():
    cache, outs, net = _run(_policy(fn=2, bn=1), STEADY[:3], net=RampNet(num_blocks=5))
    assert net.ranges == [(0, 2), (2, 4), (4, 5), (0, 2), (4, 5), (0, 2), (4, 5)]
    assert all(torch.equal(out, torch.full((1, 2), 5.0)) for out in outs)  # reuse is exact for a steady residual
    report = cache.report()["step_cache"]
    assert (report["skipped_blocks"], report["total_blocks"]) == (4, 15)
    assert report["settings"]["fn"] == 2 and report["settings"]["bn"] == 1


def test_blocks_that_leave_no_middle_fail_naming_the_flags_and_presets_shrink_to_fit():
    with pytest.raises(DeployError, match=r"--step-cache-fn 3, --step-cache-bn 1\) leave no middle block"):
        _run(DBCache("dbcache", DBCacheSettings(fn=3, bn=1, fixed=frozenset({"fn", "bn"})), 0.1), STEADY)
    assert DBCacheSettings(fn=8, bn=1).blocks(2) == (1, 0)
    assert DBCacheSettings(fn=8, bn=1).blocks(4) == (2, 1)
    assert DBCacheSettings(fn=8, bn=0, fixed=frozenset({"bn"})).blocks(2) == (1, 0)  # only the preset's Fn shrinks
    assert DBCacheSettings(fn=2, bn=1, fixed=frozenset({"fn"})).blocks(3) == (2, 0)


def test_taylorseer_extrapolates_the_residual_from_its_computed_steps():
    # The value ramps linearly; with max_continuous=1 computed steps alternate with cached ones. From step 3 on
    # (cache-dit's first derivative) order 1 extrapolates the middle residual exactly; plain reuse lags.
    values = [1.0 + 0.01 * i for i in range(8)]
    exact = [torch.full((1, 2), 4 * v) for v in values]
    _, reused, _ = _run(_policy(max_continuous=1), values)
    cache, forecast, _ = _run(_policy(max_continuous=1, taylorseer=1), values)
    assert _cached(cache) == [1, 3, 5, 7]
    assert not torch.allclose(reused[5], exact[5], atol=1e-6)
    for step in (5, 7):  # derivatives from the steps 2 -> 4 and 4 -> 6
        assert torch.allclose(forecast[step], exact[step], atol=1e-6)


def test_batched_rows_skip_the_middle_only_when_every_row_may_cache():
    net = RampNet()
    cache = StepCache(_policy(), 0.1)
    for i in range(3):  # row 0 steady, row 1 doubles every step
        values = torch.tensor([[1.0], [2.0 ** i]])
        cache.execute(StepPlan("denoise", i, 3, call=lambda network, latents, values: network(latents, values),
                               inputs={NETWORK: net, "latents": torch.zeros(2, 2), "values": values}))
    assert all(b.cached_steps == [] for b in cache._branches.values())
    assert net.ranges.count((1, 4)) == 3


def test_deploy_flags_tune_the_named_policy_and_are_checked():
    policy = deployed_policy(DeployConfig(step_cache="balanced", step_cache_fn=2, step_cache_taylorseer=2,
                                          step_cache_mask="static:1101"))
    assert policy.name == "balanced"
    assert (policy.settings.fn, policy.settings.bn, policy.settings.taylorseer) == (2, 1, 2)
    assert (policy.settings.mask, policy.settings.mask_static, policy.settings.fixed) == ((1, 1, 0, 1), True, {"fn"})
    report = make_step_cache(DeployConfig(step_cache="fast"), GenerationRequest("p")).report()["step_cache"]
    assert report["policy"] == "fast" and report["threshold"] == 0.12 and report["settings"]["taylorseer"] == 1
    with pytest.raises(DeployError, match=r"step_cache_fn \(--step-cache-fn\) tunes DBCache; .* not 'teacache'"):
        DeployConfig(step_cache="teacache", step_cache_fn=2)
    with pytest.raises(DeployError, match=r"step_cache_taylorseer \(--step-cache-taylorseer\) must be an integer "
                                          r"from 0 to 2, got 3"):
        DeployConfig(step_cache="dbcache", step_cache_taylorseer=3)
    with pytest.raises(DeployError, match=r"step_cache_fn \(--step-cache-fn\) must be an integer from 1"):
        DeployConfig(step_cache="dbcache", step_cache_fn=0)
    with pytest.raises(DeployError, match=r"step_cache_mask \(--step-cache-mask\) is \[static:\|dynamic:\]"):
        DeployConfig(step_cache="dbcache", step_cache_mask="fast:1100")


def test_cli_flags_reach_the_deployment():
    from vidloom.cli.commands import build_parser
    from vidloom.cli.deploy_args import deploy_config

    args = build_parser().parse_args([
        "generate", "--model", "wan2.1-demo", "--prompt", "p", "--step-cache", "quality", "--step-cache-fn", "2",
        "--step-cache-bn", "0", "--step-cache-warmup", "3", "--step-cache-max-cached", "5",
        "--step-cache-max-continuous", "-1", "--step-cache-taylorseer", "1", "--step-cache-mask", "dynamic:1101"])
    deploy = deploy_config(args)
    settings = deployed_policy(deploy).settings
    assert (settings.fn, settings.bn, settings.warmup, settings.max_cached, settings.max_continuous,
            settings.taylorseer, settings.mask, settings.mask_static) == (2, 0, 3, 5, -1, 1, (1, 1, 0, 1), False)
