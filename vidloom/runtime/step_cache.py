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
from typing import Any, Callable, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.core.loop import NETWORK, StepPlan
from vidloom.core.request import GenerationRequest


@runtime_checkable
class StagedNetwork(Protocol):
    """A denoiser split into the stages a step cache calls; `forward` must equal their composition."""

    num_blocks: int

    def embed(self, latents: Tensor, timestep: Tensor, text_embeds: Tensor) -> tuple[Tensor, Any]:
        """Tokens [B, S, D] for the first block, and the conditioning every block reads."""
        ...

    def run_blocks(self, x: Tensor, cond: Any, start: int = 0, end: int | None = None) -> Tensor:
        """blocks[start:end] over x."""
        ...

    def block_input(self, x: Tensor, cond: Any, index: int = 0) -> Tensor:
        """The timestep-modulated tokens block `index` feeds to self-attention."""
        ...

    def head(self, x: Tensor, cond: Any) -> Tensor:
        """Tokens after the last block -> the prediction."""
        ...


@dataclass
class BranchState:
    """What one CFG branch of one request remembers between steps (rows of batch 1)."""

    probe: Tensor | None = None
    """The policy's change indicator at the step it was last measured."""
    residual: Tensor | None = None
    """What the skipped blocks added to their input at the last computed step."""
    accumulated: float = 0.0
    """TeaCache's summed relative change since the last computed step."""


def relative_l1(current: Tensor, previous: Tensor) -> float:
    """mean|current - previous| / mean|previous|, the change measure both references use."""
    return ((current - previous).abs().mean() / previous.abs().mean().clamp_min(1e-12)).item()


class StepCachePolicy(Protocol):
    """Runs the blocks of one network call, or reuses residuals; returns (tokens, blocks skipped)."""

    name: str
    default_threshold: float

    def run_blocks(
        self, net: StagedNetwork, x: Tensor, cond: Any, branches: list[BranchState], threshold: float, step: int
    ) -> tuple[Tensor, int]: ...


@dataclass(frozen=True)
class TeaCacheRescale:
    """TeaCache's calibrated indicator for one checkpoint: which tensor it measures, the polynomial
    that maps its raw relative L1 change onto the change of the model output, and the steps that
    always compute (the published `ret_steps` warm-up)."""

    coefficients: tuple[float, ...]
    """Polynomial coefficients, highest degree first (numpy.poly1d order, as published)."""
    indicator: Callable[[StagedNetwork, Tensor, Any], Tensor]
    """(net, tokens, cond) -> the tensor whose consecutive-step change is measured."""
    warmup_steps: int = 0
    """The first steps always compute and leave the accumulator at 0."""

    def __call__(self, distance: float) -> float:
        value = 0.0
        for c in self.coefficients:  # Horner, highest degree first
            value = value * distance + c
        return value


def _wan_time_modulation(net: StagedNetwork, x: Tensor, cond: Any) -> Tensor:
    # Wan's `e0`: the shared per-block modulation [B, 6, D] (diffusers' condition_embedder.time_proj
    # output), the input TeaCache4Wan2.1 measures with use_ret_steps=True.
    return cond.time_mod


# TeaCache's published Wan2.1 T2V rescale polynomials, use_ret_steps=True variant (the one whose
# indicator is e0, with the first 5 steps always computed): ali-vilab/TeaCache,
# TeaCache4Wan2.1/teacache_generate.py (also in DiffSynth-Studio's Wan pipeline). They were fitted
# on the real weights, so they apply only to those checkpoints; random-weight demos and unknown
# folders fall back to raw relative L1 of block 0's modulated input.
WAN21_TEACACHE: dict[str, TeaCacheRescale] = {
    "wan2.1-t2v-1.3b": TeaCacheRescale(
        (-5.21862437e04, 9.23041404e03, -5.28275948e02, 1.36987616e01, -4.99875664e-02), _wan_time_modulation, 5
    ),
    "wan2.1-t2v-14b": TeaCacheRescale(
        (-3.03318725e05, 4.90537029e04, -2.65530556e03, 5.87365115e01, -3.15583525e-01), _wan_time_modulation, 5
    ),
}
"""model_id -> TeaCache's calibrated indicator; models not listed use raw relative L1 (see TeaCache)."""


class TeaCache:
    """Reuse all blocks while the accumulated (rescaled) relative L1 change of the indicator stays
    below the threshold (Liu et al. 2024, arXiv:2411.19108, section 4; the decision rule follows the
    authors' reference implementation step by step so thresholds mean the same thing).

    Per branch and per call: add the rescaled relative L1 distance between this step's indicator
    and the previous step's (computed or skipped) to the accumulator; below the threshold, reuse
    the residual; at or above it, compute the blocks and reset the accumulator to 0.

    Two threshold scales: with `rescale` (a real Wan2.1 checkpoint, WAN21_TEACACHE) thresholds are
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
        self, net: StagedNetwork, x: Tensor, cond: Any, branches: list[BranchState], threshold: float, step: int = 0
    ) -> tuple[Tensor, int]:
        rescale = self.rescale
        probe = rescale.indicator(net, x, cond) if rescale is not None else net.block_input(x, cond, 0)
        warm = rescale is not None and step < rescale.warmup_steps
        compute = warm
        for row, branch in enumerate(branches):
            current = probe[row : row + 1]
            if branch.residual is None:  # first call of this branch (the probe is set whenever the residual is)
                compute = True
            elif not warm:
                branch.accumulated += self.distance(current, branch.probe)  # type: ignore[arg-type]
                compute = compute or branch.accumulated >= threshold
            branch.probe = current  # TeaCache compares consecutive steps, computed or not
        if not compute:
            return x + torch.cat([b.residual for b in branches]), net.num_blocks  # type: ignore[misc]
        out = net.run_blocks(x, cond)
        residual = out - x
        for row, branch in enumerate(branches):
            branch.residual, branch.accumulated = residual[row : row + 1], 0.0
        return out, 0


class FirstBlockCache:
    """Always run block 0; reuse the other blocks' residual while block 0's residual differs from
    the one at the last computed step by less than the threshold (relative L1), as ParaAttention's
    FBCache does. Block 0 is the probe, so the indicator sees the real input and weights."""

    name: ClassVar[str] = "fbcache"
    default_threshold: ClassVar[float] = 0.1

    def run_blocks(
        self, net: StagedNetwork, x: Tensor, cond: Any, branches: list[BranchState], threshold: float, step: int = 0
    ) -> tuple[Tensor, int]:
        first = net.run_blocks(x, cond, 0, 1)
        probe = first - x
        reuse = all(
            b.residual is not None and b.probe is not None and relative_l1(probe[row : row + 1], b.probe) < threshold
            for row, b in enumerate(branches)
        )
        if reuse:
            return first + torch.cat([b.residual for b in branches]), net.num_blocks - 1  # type: ignore[misc]
        out = net.run_blocks(first, cond, 1)
        residual = out - first
        for row, branch in enumerate(branches):
            # The reference point moves only when the blocks run, so small drifts add up.
            branch.probe, branch.residual = probe[row : row + 1], residual[row : row + 1]
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
    deploy: DeployConfig, request: GenerationRequest, model_id: str | None = None
) -> StepCache | None:
    """The request's own step cache, or None when the deployment has none (plain steps).

    `model_id` picks TeaCache's published calibration where the checkpoint has one (WAN21_TEACACHE).
    """
    policy = step_cache_policy(deploy.step_cache)
    if isinstance(policy, TeaCache) and model_id in WAN21_TEACACHE:
        policy = TeaCache(WAN21_TEACACHE[model_id])
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
    its batch (sequential CFG: call 0 = cond, call 1 = uncond; batched: rows 0 and 1).
    """

    def __init__(self, policy: StepCachePolicy, threshold: float) -> None:
        self.policy = policy
        self.threshold = threshold
        self._branches: dict[tuple[str, int, int], BranchState] = {}
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

    def branch(self, key: tuple[str, int, int]) -> BranchState:
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

    def __call__(self, latents: Tensor, timestep: Tensor, text_embeds: Tensor) -> Tensor:
        x, cond = self.net.embed(latents, timestep, text_embeds)
        rows = x.shape[0]
        branches = [self.cache.branch((self.loop, self.calls, row)) for row in range(rows)]
        self.calls += 1
        x, skipped = self.cache.policy.run_blocks(self.net, x, cond, branches, self.cache.threshold, self.step)
        self.reused_calls += int(skipped > 0)
        self.cache.count_blocks(self.net.num_blocks * rows, skipped * rows)
        return self.net.head(x, cond)
