"""Step caches: per-request interceptors that reuse DiT block residuals on steps that barely change.

The runtime hands each loop step to a request's StepCache instead of running it
plainly. The cache swaps the step's network (`StepPlan.inputs[NETWORK]`) for a view
that runs it as stages, embed -> blocks -> head, and lets a policy decide per call
whether to run the blocks or add back the residual they produced at the last
computed step. Policies are stateless; every tensor lives in the request's StepCache,
one BranchState per CFG branch, so concurrent requests and the cond/uncond branches
never mix.

- teacache: Liu et al. 2024, "Timestep Embedding Tells: It's Time to Cache for Video
  Diffusion Model", arXiv:2411.19108.
- dbcache and its presets (quality, balanced, fast), with TaylorSeer and step masks: cache-dit's
  DBCache (runtime.dbcache); fbcache, the first-block cache of ParaAttention (FBCache,
  github.com/chengzeyi/ParaAttention), is its F1B0 case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Protocol

from torch import Tensor

from vidloom.core.denoiser import StagedDenoiser, Stream, TeaCacheRescale, cache_scope
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.core.loop import NETWORK, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.runtime.cache_stream import (
    BranchState, add, relative_l1, row, rows, same_shape, shard_sums, stack_rows, sub,
)
from vidloom.runtime.dbcache import DBCache, DBCacheSettings, parse_mask
from vidloom.runtime.rank_share import RankShare


StagedNetwork = StagedDenoiser
"""The denoiser contract step caches call (core.denoiser.StagedDenoiser; the old name, kept for importers)."""


class StepCachePolicy(Protocol):
    """Runs the blocks of one network call, or reuses residuals; returns (stream, blocks skipped)."""

    name: str
    default_threshold: float

    def run_blocks(
        self, net: StagedNetwork, x: Stream, cond: Any, branches: list[BranchState], threshold: float, step: int
    ) -> tuple[Stream, int]: ...


class TeaCache:
    """Reuse all blocks while the accumulated (rescaled) relative L1 change of the indicator stays
    below the threshold (Liu et al. 2024, arXiv:2411.19108, section 4; the decision rule follows the
    authors' reference implementation step by step so thresholds mean the same thing).

    Per branch and per call: add the rescaled relative L1 distance between this step's indicator
    and the previous step's (computed or skipped) to the accumulator; below the threshold, reuse
    the residual; at or above it, compute the blocks and reset the accumulator to 0.

    Two threshold scales: with `rescale` (a calibrated checkpoint: its card's `teacache`) thresholds are
    TeaCache's published ones (0.05-0.3 for Wan); without it the indicator is block 0's modulated
    input and the distance is raw relative L1, a different scale (README, Acceleration).
    """

    name: ClassVar[str] = "teacache"
    default_threshold: ClassVar[float] = 0.1

    def __init__(self, rescale: TeaCacheRescale | None = None) -> None:
        self.rescale = rescale

    def distance(self, current: Tensor, previous: Tensor) -> float:
        raw = relative_l1(current, previous)
        return self.rescale(raw) if self.rescale is not None else raw

    def run_blocks(
        self, net: StagedNetwork, x: Stream, cond: Any, branches: list[BranchState], threshold: float, step: int = 0
    ) -> tuple[Stream, int]:
        rescale = self.rescale
        probe = rescale.indicator(net, x, cond) if rescale is not None else net.block_input(x, cond, 0)
        warm = rescale is not None and step < rescale.warmup_steps
        compute = warm
        for r, branch in enumerate(branches):
            current = probe[r : r + 1]
            if not same_shape(branch.residual, row(x, r)):  # first call of this branch, or a new shape
                compute = True
            elif not warm:
                branch.accumulated += self.distance(current, branch.probe)  # type: ignore[arg-type]
                compute = compute or branch.accumulated >= threshold
            branch.probe = current  # TeaCache compares consecutive steps, computed or not
        if not compute:
            return add(x, stack_rows([b.residual for b in branches])), net.num_blocks  # type: ignore[misc]
        out = net.run_blocks(x, cond)
        residual = sub(out, x)
        for r, branch in enumerate(branches):
            branch.residual, branch.accumulated = row(residual, r), 0.0
        return out, 0


STEP_CACHES: dict[str, StepCachePolicy] = {
    "teacache": TeaCache(),
    # ParaAttention's FBCache = cache-dit's DBCache F1B0; only a branch's first call computes unasked.
    "fbcache": DBCache("fbcache", DBCacheSettings(fn=1, bn=0, warmup=1), default_threshold=0.1),
    # cache-dit's DBCacheConfig defaults (F8B0, threshold 0.08, 8 warm-up steps, no limits).
    "dbcache": DBCache("dbcache", DBCacheSettings(), default_threshold=0.08),
    # Calibration-free presets (docs/acceleration.md): more front/back blocks, a lower threshold, a longer
    # warm-up and a shorter streak for quality; TaylorSeer forecasts where streaks are longer.
    "quality": DBCache("quality", DBCacheSettings(fn=8, bn=1, warmup=8, max_continuous=2), default_threshold=0.06),
    "balanced": DBCache("balanced", DBCacheSettings(fn=4, bn=1, warmup=6, max_continuous=3, taylorseer=1),
                        default_threshold=0.08),
    "fast": DBCache("fast", DBCacheSettings(fn=1, bn=0, warmup=4, max_continuous=4, taylorseer=1),
                    default_threshold=0.12),
}
"""DeployConfig.step_cache -> policy (stateless, shared); "none" turns caching off."""


def step_cache_policy(name: str) -> StepCachePolicy | None:
    """The policy called `name` (None for "none"); unknown names raise DeployError listing the known ones."""
    if name == "none":
        return None
    policy = STEP_CACHES.get(name)
    if policy is None:
        raise DeployError(f"unknown step_cache {name!r}; known: none, {', '.join(STEP_CACHES)}")
    return policy


# DeployConfig field -> DBCacheSettings field: the deployment's flags over the named policy's settings.
_DBCACHE_FLAGS = {"step_cache_fn": "fn", "step_cache_bn": "bn", "step_cache_warmup": "warmup",
                  "step_cache_max_cached": "max_cached", "step_cache_max_continuous": "max_continuous",
                  "step_cache_taylorseer": "taylorseer"}


def deployed_policy(deploy: DeployConfig) -> StepCachePolicy | None:
    """The deployment's policy with its DBCache flags applied (DeployError for an unknown name)."""
    policy = step_cache_policy(deploy.step_cache)
    if not isinstance(policy, DBCache):
        return policy  # DeployConfig refuses DBCache flags on teacache and none
    changes: dict[str, Any] = {key: getattr(deploy, flag) for flag, key in _DBCACHE_FLAGS.items()
                               if getattr(deploy, flag) is not None}
    if deploy.step_cache_mask is not None:
        changes["mask"], changes["mask_static"] = parse_mask(deploy.step_cache_mask)
    changes["fixed"] = frozenset(k for k in ("fn", "bn") if k in changes)  # blocks the user chose fit as given
    return policy.tuned(**changes) if changes else policy


def make_step_cache(
    deploy: DeployConfig, request: GenerationRequest, rescale: TeaCacheRescale | None = None,
    share: RankShare | None = None,
) -> StepCache | None:
    """The request's own step cache, or None when the deployment has none (plain steps).

    `rescale`: TeaCache's calibrated indicator for this checkpoint (its card's `teacache`), if it has one;
    `share`: a parallel rank's part (RankShare), None on one device.
    """
    policy = deployed_policy(deploy)
    if isinstance(policy, TeaCache) and rescale is not None:
        policy = TeaCache(rescale)
    if policy is None:
        if request.step_cache_threshold is not None:
            raise InvalidRequest(
                "step_cache_threshold",
                "this model is deployed without a step cache (step_cache='none'); "
                f"deploy one of {', '.join(STEP_CACHES)} to set a threshold",
            )
        return None
    threshold = request.step_cache_threshold
    if threshold is None:
        threshold = deploy.step_cache_threshold if deploy.step_cache_threshold is not None else policy.default_threshold
    return StepCache(policy, float(threshold), share or RankShare())


@dataclass
class _Counts:
    steps: int = 0
    skipped_steps: int = 0  # every branch of the step reused the cache
    blocks: int = 0  # block evaluations per branch the plain path would have run
    skipped_blocks: int = 0


class StepCache:
    """One request's step cache: the StepInterceptor RequestRun hands each loop step to.

    A CFG branch is identified by position: the k-th network call of a step, row r of
    its batch (sequential CFG: call 0 = cond, call 1 = uncond; batched: rows 0 and 1), within
    the network's cache scope (core.denoiser.cache_scope: a causal rollout's chunk).
    """

    def __init__(self, policy: StepCachePolicy, threshold: float, share: RankShare | None = None) -> None:
        self.policy = policy
        self.threshold = threshold
        self.share = share or RankShare()
        self._branches: dict[tuple[str, Hashable, int, int], BranchState] = {}
        self._counts = _Counts()

    def execute(self, plan: StepPlan) -> Any:
        network = plan.inputs.get(NETWORK)
        if network is None:
            return plan.call(**plan.inputs)
        if not isinstance(network, StagedNetwork):
            raise TypeError(f"step cache {self.policy.name!r} needs a staged network, got {type(network).__name__}")
        # Each expert of a mixture (Wan2.2 A14B) keeps its own residuals: one expert's never stand in for another's.
        view = _CachedNetwork(self, network, plan.loop if plan.expert is None else f"{plan.loop}/{plan.expert}", plan.index)
        with shard_sums(self.share.sums):
            result = plan.call(**{**plan.inputs, NETWORK: view})
        self._counts.steps += 1
        self._counts.skipped_steps += int(view.calls > 0 and view.reused_calls == view.calls)
        return result

    def branch(self, key: tuple[str, Hashable, int, int]) -> BranchState:
        return self._branches.setdefault(key, BranchState())

    def count_blocks(self, total: int, skipped: int) -> None:
        self._counts.blocks += total
        self._counts.skipped_blocks += skipped

    def report(self) -> dict[str, Any]:
        c = self._counts
        return {
            "step_cache": {
                "policy": self.policy.name,
                "threshold": self.threshold,
                **({"settings": self.policy.describe()} if isinstance(self.policy, DBCache) else {}),
                "skipped_steps": c.skipped_steps,
                "computed_steps": c.steps - c.skipped_steps,
                "skipped_blocks": c.skipped_blocks,
                "total_blocks": c.blocks,
                **({"counts": self.share.note} if self.share.note else {}),
            }
        }

    def close(self) -> None:
        self._branches.clear()


@dataclass
class _CachedNetwork:
    """The network as one step's body sees it: same call signature, blocks run by the policy."""

    cache: StepCache
    net: StagedNetwork
    loop: str
    step: int
    calls: int = 0
    reused_calls: int = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x, cond = self.net.embed(*args, **kwargs)
        count = rows(x)
        scope = cache_scope(self.net)
        branches = [self.cache.branch((self.loop, scope, self.calls, r)) for r in range(count)]
        self.calls += 1
        x, skipped = self.cache.policy.run_blocks(self.net, x, cond, branches, self.cache.threshold, self.step)
        self.reused_calls += int(skipped > 0)
        self.cache.count_blocks(self.net.num_blocks * count, skipped * count)
        return self.net.head(x, cond)
