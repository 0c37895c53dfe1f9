"""DBCache: Fn front blocks always run, Bn back blocks always run, the middle blocks' residual is reused
(or forecast by TaylorSeer) while the front blocks' residual barely changes.

cache-dit's Dual Block Cache (github.com/vipshop/cache-dit, docs/DBCache.md; v1.5.3). The per-step decision
follows its `CachedContextManager.can_cache` in order, so thresholds, warm-up, step limits and step masks
mean the same thing and a run takes the same compute/cache decisions: warm-up steps compute; a step mask's
1 steps compute and, under the static mask policy, its 0 steps cache; then the cached-step limits; then the
relative L1 change of the Fn residual against the one at the last computed step, below the threshold.
The first-block cache (fbcache, ParaAttention's FBCache) is the F1B0 case.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vidloom.core.denoiser import StagedDenoiser, Stream
from vidloom.core.errors import DeployError
from vidloom.runtime.cache_stream import BranchState, add, relative_l1, row, same_shape, stack_rows, sub
from vidloom.runtime.taylorseer import TaylorSeer


@dataclass(frozen=True)
class DBCacheSettings:
    """One DBCache configuration (cache-dit's DBCacheConfig fields in brackets)."""

    fn: int = 8
    """Front blocks run every step; their residual is the change indicator [Fn_compute_blocks]."""
    bn: int = 0
    """Back blocks run every step on the (reused) middle output [Bn_compute_blocks]."""
    warmup: int = 8
    """A branch's first steps always compute [max_warmup_steps]."""
    max_cached: int = -1
    """A branch caches at most this many steps (-1: no limit) [max_cached_steps]."""
    max_continuous: int = -1
    """... and at most this many in a row (-1: no limit) [max_continuous_cached_steps]."""
    taylorseer: int = 0
    """Forecast the middle residual with TaylorSeer of this order (0: reuse it unchanged) [taylorseer_order]."""
    mask: tuple[int, ...] | None = None
    """Per step: 1 computes, 0 may cache; steps past its end follow the policy [steps_computation_mask]."""
    mask_static: bool = False
    """The mask's 0 steps cache without measuring the change [steps_computation_policy="static"]."""
    fixed: frozenset[str] = frozenset()
    """Which of "fn", "bn" the user gave; the others came from a preset and shrink to leave one middle block in
    small models."""

    def blocks(self, total: int) -> tuple[int, int]:
        """(Fn, Bn) for a network of `total` blocks; at least one middle block must remain."""
        fn, bn = self.fn, self.bn
        if fn + bn < total:
            return fn, bn
        if "bn" not in self.fixed:
            bn = min(bn, max(total - 1 - (fn if "fn" in self.fixed else 1), 0))
        if "fn" not in self.fixed:
            fn = max(1, min(fn, total - bn - 1))
        if fn + bn < total:
            return fn, bn
        raise DeployError(
            f"step_cache_fn + step_cache_bn (--step-cache-fn {fn}, --step-cache-bn {bn}) leave no middle block "
            f"to cache in this model's {total} blocks; choose Fn + Bn below {total}")

    def warmup_steps(self) -> int:
        """Warm-up ends no later than the mask's leading compute steps (cache-dit truncates it so)."""
        if self.mask is None:
            return self.warmup
        leading = next((i for i, m in enumerate(self.mask) if m != 1), len(self.mask))
        return min(self.warmup, leading)

    def describe(self) -> dict[str, Any]:
        """The settings as the run's metadata reports them."""
        out: dict[str, Any] = dict(fn=self.fn, bn=self.bn, warmup=self.warmup, max_cached=self.max_cached,
                                   max_continuous=self.max_continuous, taylorseer=self.taylorseer)
        if self.mask is not None:
            out["mask"] = ("static:" if self.mask_static else "dynamic:") + "".join(map(str, self.mask))
        return out


def parse_mask(text: str) -> tuple[tuple[int, ...], bool]:
    """'[static:|dynamic:]1110110...' -> (mask, static); DeployConfig has checked the format."""
    policy, _, bits = text.rpartition(":")
    return tuple(int(c) for c in bits), policy == "static"


class DBCache:
    """The DBCache step-cache policy for one setting (stateless: every tensor lives in the BranchStates)."""

    def __init__(self, name: str, settings: DBCacheSettings, default_threshold: float) -> None:
        self.name = name
        self.settings = settings
        self.default_threshold = default_threshold

    def tuned(self, **changes: Any) -> "DBCache":
        """This policy with some settings replaced (a deployment's flags over a preset)."""
        return DBCache(self.name, replace(self.settings, **changes), self.default_threshold)

    def describe(self) -> dict[str, Any]:
        return self.settings.describe()

    def run_blocks(
        self, net: StagedDenoiser, x: Stream, cond: Any, branches: list[BranchState], threshold: float, step: int = 0
    ) -> tuple[Stream, int]:
        total = net.num_blocks
        fn, bn = self.settings.blocks(total)
        front = net.run_blocks(x, cond, 0, fn)
        probe = sub(front, x)
        # Every row decides (and counts its streak) as cache-dit's context for that branch would; the middle
        # blocks of a batched call are skipped only when every row may cache.
        cache = [self._can_cache(b, row(probe, r), row(front, r), threshold) for r, b in enumerate(branches)]
        if all(cache):
            middle = add(front, stack_rows([self._residual(b) for b in branches]))
            for b in branches:
                b.cached_steps.append(b.steps)
                b.continuous += 1
            skipped = total - fn - bn
        else:
            middle = net.run_blocks(front, cond, fn, total - bn)
            residual = sub(middle, front)
            for r, b in enumerate(branches):
                # The reference point moves only when the blocks run, so small drifts add up.
                b.probe = row(probe, r)
                self._remember(b, row(residual, r))
            skipped = 0
        for b in branches:
            b.steps += 1
        return (net.run_blocks(middle, cond, total - bn) if bn else middle), skipped

    def _can_cache(self, b: BranchState, probe: Stream, front: Stream, threshold: float) -> bool:
        """cache-dit's can_cache + similarity for this branch's current step (b.steps), in its order."""
        s, step = self.settings, b.steps
        if not b.cached_steps or b.cached_steps[-1] != step - 1:
            b.continuous = 0  # a computed step breaks the streak (cache-dit: mark_step_begin)
        fits = b.probe is not None and same_shape(b.probe, probe) and self._has_residual(b, front)
        if step < s.warmup_steps():
            return False
        if s.mask is not None and step < len(s.mask) and s.mask[step] == 1:
            return False
        if s.mask is not None and s.mask_static:
            return fits  # cache-dit caches unconditionally here; a branch with nothing to reuse yet computes
        if 0 <= s.max_cached <= len(b.cached_steps) or 0 <= s.max_continuous <= b.continuous:
            return False
        if threshold <= 0.0 or not fits:
            return False
        # cache-dit caches unmeasured at a threshold >= 1; here every threshold is a measure (random-weight models
        # change by more than 1 per step, and fbcache's thresholds kept their meaning): 1e9 caches every step.
        return relative_l1(probe, b.probe) < threshold  # type: ignore[arg-type]

    def _has_residual(self, b: BranchState, front: Stream) -> bool:
        held = b.history.terms[0] if b.history is not None else b.residual
        return same_shape(held, front)

    def _residual(self, b: BranchState) -> Stream:
        return b.history.approximate(b.steps) if b.history is not None else b.residual  # type: ignore[return-value]

    def _remember(self, b: BranchState, residual: Stream) -> None:
        if not self.settings.taylorseer:
            b.residual = residual
            return
        if b.history is None:
            b.history = TaylorSeer(self.settings.taylorseer, born=b.steps)
        b.history.update(residual, b.steps)
