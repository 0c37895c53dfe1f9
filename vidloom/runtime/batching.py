"""Cross-request batching of denoise steps: which planned steps may share one forward, and running them.

A family declares, on each denoise StepPlan (`plan.denoiser`, core.denoiser.DenoiseInputs), which of
its inputs are per sample (stacked along the batch: latents, per-sample timesteps, conditional and
unconditional embeddings) and which are per-request guidance scales; every other input must be the
same for all plans of a batch. So any family that declares its step batches, whatever its inputs are
called: plans are compatible when they run the same call on the same network with per-sample inputs
that stack (same trailing shapes, dtypes, devices, None where the others are None) and equal shared
inputs. Timesteps and scales are per sample, so requests at different steps still batch.

The network takes part in two ways: a shared module (Wan's transformer: equal by identity), or a
per-request view that declares `batch_key()` and `stack(views)`: the family's own rule for which of its
requests share a forward (Flux2's position ids and reference tokens, Wan image-to-video's CLIP tokens,
an offloaded Wan2.2 expert's placement). A per-sample value that is not a tensor stacks the same way.
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import torch
from torch import Tensor

from vidloom.core.denoiser import DenoiseInputs
from vidloom.core.footprint import tensor_bytes
from vidloom.core.loop import NETWORK, StepPlan


def batch_key(plan: StepPlan) -> Hashable | None:
    """Equal keys may run in one forward; None: this plan runs alone (it declares no denoiser inputs, or
    one of them cannot stack)."""
    spec, inputs = plan.denoiser, plan.inputs
    if spec is None or not spec.per_sample:
        return None
    if not set(spec.per_sample) | set(spec.scales) <= set(inputs) or not isinstance(inputs[spec.per_sample[0]], Tensor):
        return None
    # A step without a network input (a prompt prefill whose modules are shared inputs) stacks its per-sample ones.
    parts = [_stack_key(inputs[NETWORK], network=True)] if NETWORK in inputs else []
    parts += [_stack_key(inputs[name]) for name in spec.per_sample]
    if any(part is _UNSTACKABLE for part in parts):
        return None
    declared = {NETWORK, *spec.per_sample, *spec.scales}
    shared = tuple((name, _shared_key(inputs[name])) for name in sorted(set(inputs) - declared))
    return (plan.loop, id(plan.call), spec, tuple(parts), shared)


_UNSTACKABLE = object()


def _stack_key(value: Any, network: bool = False) -> Any:
    if value is None:
        return None
    if isinstance(value, Tensor):
        return ("tensor", tuple(value.shape[1:]), value.dtype, value.device)
    key_fn = getattr(value, "batch_key", None)
    if callable(key_fn):
        key = key_fn()
        return _UNSTACKABLE if key is None else ("view", key)
    return ("module", id(value)) if network else _UNSTACKABLE


def _shared_key(value: Any) -> Hashable:
    """Plans batch only when their other inputs are equal: by value when hashable, else by identity."""
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return ("value", type(value), value)


def plan_rows(plan: StepPlan) -> int:
    """How many samples `plan` contributes to a batched forward (its lead per-sample input's batch)."""
    spec: DenoiseInputs = plan.denoiser  # type: ignore[assignment]
    return int(plan.inputs[spec.per_sample[0]].shape[0])


def stacked_bytes(plans: Sequence[StepPlan]) -> int:
    """Bytes a batched forward of `plans` copies beyond what each request holds, until the step ends: its per-sample
    inputs stacked (tensors, and values that declare `stacked_bytes`, as layers.prompt_kv.PromptKV) and each network
    view's declared `stacked_bytes` (a Cosmos3 view's prefixes); 0 for one plan, which runs on its own inputs. The
    device worker reserves it on the request memory ledger before the step (runtime.worker_rounds)."""
    if len(plans) < 2:
        return 0
    spec: DenoiseInputs = plans[0].denoiser  # type: ignore[assignment]
    names = ((NETWORK,) if NETWORK in plans[0].inputs else ()) + spec.per_sample
    return sum(_copied(plan.inputs[name]) for plan in plans for name in names)


def _copied(value: Any) -> int:
    if isinstance(value, Tensor):
        return tensor_bytes(value)
    declared = getattr(value, "stacked_bytes", None)  # a shared module declares none: it is not copied
    return int(declared) if declared is not None else 0


def run_batched(plans: Sequence[StepPlan]) -> list[Any]:
    """Execute compatible plans (equal batch_key) as one call; returns each plan's own result."""
    if len(plans) == 1:
        return [plans[0].call(**plans[0].inputs)]
    first = plans[0]
    spec: DenoiseInputs = first.denoiser  # type: ignore[assignment]
    inputs: dict[str, Any] = dict(first.inputs)
    if NETWORK in inputs:
        inputs[NETWORK] = _stack_values([p.inputs[NETWORK] for p in plans], fallback_first=True)
    for name in spec.per_sample:
        inputs[name] = _stack_values([p.inputs[name] for p in plans])
    lead = spec.per_sample[0]
    for name in spec.scales:
        inputs[name] = _stack_scales(plans, name, lead, inputs[lead])
    out = first.call(**inputs)
    sizes = [p.inputs[lead].shape[0] for p in plans]
    if isinstance(out, tuple):
        pieces = [part.split(sizes, dim=0) if part is not None else (None,) * len(plans) for part in out]
        return [tuple(piece[i] for piece in pieces) for i in range(len(plans))]
    return list(out.split(sizes, dim=0))


def _stack_values(values: list[Any], fallback_first: bool = False) -> Any:
    if values[0] is None:
        return None
    if isinstance(values[0], Tensor):
        return torch.cat(values, dim=0)
    stack = getattr(values[0], "stack", None)
    if callable(stack):
        return stack(values)
    if fallback_first:  # a shared module: equal by identity (the key checked it)
        return values[0]
    raise AssertionError(f"{type(values[0]).__name__} has no stack(); batch_key should have refused it")


def _stack_scales(plans: Sequence[StepPlan], name: str, lead: str, stacked: Tensor) -> float | Tensor | None:
    """One float when every request guides alike (the unbatched arithmetic exactly), else a
    float32 [B, 1, ...] tensor broadcasting over each sample; None when none guides (a family whose per-sample
    inputs then differ in shape from guided ones', so the key never mixes the two)."""
    scales = [p.inputs[name] for p in plans]
    if all(s is None for s in scales):
        return None
    if all(isinstance(s, (int, float)) for s in scales) and len(set(scales)) == 1:
        return float(scales[0])
    per_sample = []
    for plan, scale in zip(plans, scales):
        value = scale.float().reshape(()) if isinstance(scale, Tensor) else torch.tensor(float(scale))
        per_sample.append(value.expand(plan.inputs[lead].shape[0]))
    shape = (-1,) + (1,) * (stacked.dim() - 1)
    return torch.cat(per_sample).to(stacked.device).reshape(shape)


class BatchStats:
    """How many forwards the batch policy ran and how many request-steps they carried (worker thread only)."""

    def __init__(self) -> None:
        self.forwards = 0
        self.steps = 0
        self.largest = 0
        self.memory_splits = 0  # batches cut short because their stacked copy did not fit the memory budget

    def add(self, size: int) -> None:
        self.forwards += 1
        self.steps += size
        self.largest = max(self.largest, size)

    def summary(self) -> dict[str, float]:
        mean = self.steps / self.forwards if self.forwards else 0.0
        return {"forwards": self.forwards, "request_steps": self.steps, "mean_batch": round(mean, 3),
                "largest_batch": self.largest, "memory_splits": self.memory_splits}
