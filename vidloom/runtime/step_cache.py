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
- fbcache: the first-block cache of ParaAttention (FBCache, github.com/chengzeyi/ParaAttention),
  also cache-dit's DBCache with one front block and none behind (Fn=1, Bn=0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Protocol

import torch
from torch import Tensor

from vidloom.core.denoiser import StagedDenoiser, Stream, TeaCacheRescale, cache_scope
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.core.loop import NETWORK, StepPlan
from vidloom.core.request import GenerationRequest


StagedNetwork = StagedDenoiser
"""The denoiser contract step caches call (core.denoiser.StagedDenoiser; the old name, kept for importers)."""


@dataclass
class BranchState:
    """What one CFG branch of one request remembers between steps (row r of each stream tensor)."""

    probe: Stream | None = None
    """The policy's change indicator at the step it was last measured."""
    residual: Stream | None = None
    """What the skipped blocks added to their input at the last computed step."""
    accumulated: float = 0.0
    """TeaCache's summed relative change since the last computed step."""


# -- the residual stream: one tensor or a tuple of them, rows are samples ---------------------------


def _map(fn: Any, *streams: Stream) -> Stream:
    if isinstance(streams[0], tuple):
        return tuple(fn(*parts) for parts in zip(*streams))
    return fn(*streams)


def _sub(a: Stream, b: Stream) -> Stream:
    return _map(torch.sub, a, b)


def _add(a: Stream, b: Stream) -> Stream:
    return _map(torch.add, a, b)


def _row(x: Stream, row: int) -> Stream:
    return _map(lambda t: t[row : row + 1], x)


def _rows(x: Stream) -> int:
    return (x[0] if isinstance(x, tuple) else x).shape[0]


def _stack_rows(parts: list[Stream]) -> Stream:
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(group) for group in zip(*parts))  # type: ignore[arg-type]
    return torch.cat(parts)  # type: ignore[arg-type]


def _same_shape(a: Stream | None, b: Stream) -> bool:
    """Whether a remembered residual still fits this call's stream (a new token count never reuses one)."""
    if a is None or isinstance(a, tuple) != isinstance(b, tuple):
        return False
    pairs = zip(a, b) if isinstance(a, tuple) else [(a, b)]
    return all(x.shape == y.shape for x, y in pairs)  # type: ignore[union-attr]


def relative_l1(current: Stream, previous: Stream) -> float:
    """mean|current - previous| / mean|previous| (over every stream), the change measure both references use."""
    if isinstance(current, tuple):
        diff = sum((c - p).abs().sum() for c, p in zip(current, previous))  # type: ignore[arg-type]
        base = sum(p.abs().sum() for p in previous)  # type: ignore[union-attr]
        return (diff / torch.as_tensor(base).clamp_min(1e-12)).item()  # type: ignore[operator]
    return ((current - previous).abs().mean() / previous.abs().mean().clamp_min(1e-12)).item()  # type: ignore[operator]


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
        for row, branch in enumerate(branches):
            current = probe[row : row + 1]
            if not _same_shape(branch.residual, _row(x, row)):  # first call of this branch, or a new shape
                compute = True
            elif not warm:
                branch.accumulated += self.distance(current, branch.probe)  # type: ignore[arg-type]
                compute = compute or branch.accumulated >= threshold
            branch.probe = current  # TeaCache compares consecutive steps, computed or not
        if not compute:
            return _add(x, _stack_rows([b.residual for b in branches])), net.num_blocks  # type: ignore[misc]
        out = net.run_blocks(x, cond)
        residual = _sub(out, x)
        for row, branch in enumerate(branches):
            branch.residual, branch.accumulated = _row(residual, row), 0.0
        return out, 0


class FirstBlockCache:
    """Always run block 0; reuse the other blocks' residual while block 0's residual differs from
    the one at the last computed step by less than the threshold (relative L1), as ParaAttention's
    FBCache does. Block 0 is the probe, so the indicator sees the real input and weights."""

    name: ClassVar[str] = "fbcache"
    default_threshold: ClassVar[float] = 0.1

    def run_blocks(
        self, net: StagedNetwork, x: Stream, cond: Any, branches: list[BranchState], threshold: float, step: int = 0
    ) -> tuple[Stream, int]:
        first = net.run_blocks(x, cond, 0, 1)
        probe = _sub(first, x)
        reuse = all(
            _same_shape(b.residual, _row(first, row)) and b.probe is not None
            and relative_l1(_row(probe, row), b.probe) < threshold
            for row, b in enumerate(branches)
        )
        if reuse:
            return _add(first, _stack_rows([b.residual for b in branches])), net.num_blocks - 1  # type: ignore[misc]
        out = net.run_blocks(first, cond, 1)
        residual = _sub(out, first)
        for row, branch in enumerate(branches):
            # The reference point moves only when the blocks run, so small drifts add up.
            branch.probe, branch.residual = _row(probe, row), _row(residual, row)
        return out, 0


STEP_CACHES: dict[str, StepCachePolicy] = {
    "teacache": TeaCache(),
    "fbcache": FirstBlockCache(),
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


def make_step_cache(
    deploy: DeployConfig, request: GenerationRequest, rescale: TeaCacheRescale | None = None
) -> StepCache | None:
    """The request's own step cache, or None when the deployment has none (plain steps).

    `rescale`: TeaCache's calibrated indicator for this checkpoint (its card's `teacache`), if it has one.
    """
    policy = step_cache_policy(deploy.step_cache)
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
    return StepCache(policy, float(threshold))


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

    def __init__(self, policy: StepCachePolicy, threshold: float) -> None:
        self.policy = policy
        self.threshold = threshold
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
                "skipped_steps": c.skipped_steps,
                "computed_steps": c.steps - c.skipped_steps,
                "skipped_blocks": c.skipped_blocks,
                "total_blocks": c.blocks,
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
        rows = _rows(x)
        scope = cache_scope(self.net)
        branches = [self.cache.branch((self.loop, scope, self.calls, row)) for row in range(rows)]
        self.calls += 1
        x, skipped = self.cache.policy.run_blocks(self.net, x, cond, branches, self.cache.threshold, self.step)
        self.reused_calls += int(skipped > 0)
        self.cache.count_blocks(self.net.num_blocks * rows, skipped * rows)
        return self.net.head(x, cond)
