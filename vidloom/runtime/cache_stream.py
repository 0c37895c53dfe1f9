"""The residual stream as step caches see it: one tensor or a tuple of them, rows are samples (CFG branches)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vidloom.core.denoiser import Stream


@dataclass
class BranchState:
    """What one CFG branch of one request remembers between steps (row r of each stream tensor)."""

    probe: Stream | None = None
    """The policy's change indicator at the step it was last measured."""
    residual: Stream | None = None
    """What the skipped blocks added to their input at the last computed step."""
    accumulated: float = 0.0
    """TeaCache's summed relative change since the last computed step."""
    steps: int = 0
    """Calls of this branch so far: the index of its current step (cache-dit's per-context step)."""
    cached_steps: list[int] = field(default_factory=list)
    """DBCache: the steps this branch reused its residual."""
    continuous: int = 0
    """DBCache: consecutive cached steps up to the previous one."""
    history: Any = None
    """DBCache with TaylorSeer: the residual's Taylor terms (runtime.taylorseer.TaylorSeer)."""


def map_stream(fn: Any, *streams: Stream) -> Stream:
    """fn over each stream tensor (or the one tensor)."""
    if isinstance(streams[0], tuple):
        return tuple(fn(*parts) for parts in zip(*streams))
    return fn(*streams)


def sub(a: Stream, b: Stream) -> Stream:
    return map_stream(torch.sub, a, b)


def add(a: Stream, b: Stream) -> Stream:
    return map_stream(torch.add, a, b)


def row(x: Stream, index: int) -> Stream:
    return map_stream(lambda t: t[index : index + 1], x)


def rows(x: Stream) -> int:
    return (x[0] if isinstance(x, tuple) else x).shape[0]


def stack_rows(parts: list[Stream]) -> Stream:
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(group) for group in zip(*parts))  # type: ignore[arg-type]
    return torch.cat(parts)  # type: ignore[arg-type]


def same_shape(a: Stream | None, b: Stream) -> bool:
    """Whether a remembered residual still fits this call's stream (a new token count never reuses one)."""
    if a is None or isinstance(a, tuple) != isinstance(b, tuple):
        return False
    pairs = zip(a, b) if isinstance(a, tuple) else [(a, b)]
    return all(x.shape == y.shape for x, y in pairs)  # type: ignore[union-attr]


def relative_l1(current: Stream, previous: Stream) -> float:
    """mean|current - previous| / mean|previous| (over every stream), the change measure both references use.

    Inside `shard_sums(group)` (a sequence-parallel rank's step cache) each rank holds 1/P of the tokens: the two
    sums are added over the group first, so every rank measures the whole sequence and takes the same decision."""
    group = _SHARD_GROUP.get()
    if group is not None:
        pairs = zip(current, previous) if isinstance(current, tuple) else [(current, previous)]
        sums = torch.stack([torch.stack([(c - p).abs().sum(), p.abs().sum()]).double() for c, p in pairs]).sum(0)
        sums = group.all_gather(sums).sum(0)  # the same values in the same order on every rank
        return (sums[0] / sums[1].clamp_min(1e-12)).item()
    if isinstance(current, tuple):
        diff = sum((c - p).abs().sum() for c, p in zip(current, previous))  # type: ignore[arg-type]
        base = sum(p.abs().sum() for p in previous)  # type: ignore[union-attr]
        return (diff / torch.as_tensor(base).clamp_min(1e-12)).item()  # type: ignore[operator]
    return ((current - previous).abs().mean() / previous.abs().mean().clamp_min(1e-12)).item()  # type: ignore[operator]


_SHARD_GROUP: contextvars.ContextVar[Any] = contextvars.ContextVar("shard_group", default=None)


@contextlib.contextmanager
def shard_sums(group: Any) -> Iterator[None]:
    """Change measures in this context sum over `group` (a Comm of sequence-parallel ranks; None: this device)."""
    token = _SHARD_GROUP.set(group)
    try:
        yield
    finally:
        _SHARD_GROUP.reset(token)
