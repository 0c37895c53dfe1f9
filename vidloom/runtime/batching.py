"""Cross-request batching of denoise steps: which planned steps may share one forward, and running them.

A denoise StepPlan calls a guidance policy with (network, latents, timestep, prompt_embeds,
negative_embeds, guidance_scale). Plans of different requests are compatible when the same
policy would run the same network on inputs that stack along the batch: same latent shape and
dtype, same text shape, CFG on for all or for none. Timesteps and guidance scales are passed
per sample, so requests at different steps (or with different step counts) still batch.

A network may take part in batching in two ways: it is a shared module (Wan's transformer:
equal by identity), or it is a per-request view that declares `batch_key()` and
`stack(views)`: the family's own rule for which of its requests share a forward (Flux2's network
carries position ids and reference tokens, Wan image-to-video's its CLIP tokens, an offloaded
Wan2.2 expert its placement; views with equal keys stack what they carry).
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import torch
from torch import Tensor

from vidloom.core.loop import NETWORK, StepPlan

_STACKED = ("latents", "timestep", "prompt_embeds", "negative_embeds")
_EXPECTED = frozenset((NETWORK, *_STACKED, "guidance_scale"))


def batch_key(plan: StepPlan) -> Hashable | None:
    """Equal keys may run in one forward; None: this plan runs alone."""
    inputs = plan.inputs
    if set(inputs) != _EXPECTED or not isinstance(inputs["latents"], Tensor):
        return None  # not a guided denoise step we know how to stack
    network = inputs[NETWORK]
    key_fn = getattr(network, "batch_key", None)
    net_key = key_fn() if callable(key_fn) else ("module", id(network))
    if net_key is None:
        return None
    latents, text, negative = inputs["latents"], inputs["prompt_embeds"], inputs["negative_embeds"]
    return (
        plan.loop, id(plan.call), net_key,
        tuple(latents.shape[1:]), latents.dtype, latents.device,
        tuple(text.shape[1:]), text.dtype,
        None if negative is None else tuple(negative.shape[1:]),
    )


def run_batched(plans: Sequence[StepPlan]) -> list[Any]:
    """Execute compatible plans (equal batch_key) as one call; returns each plan's own result."""
    if len(plans) == 1:
        return [plans[0].call(**plans[0].inputs)]
    first = plans[0]
    inputs: dict[str, Any] = {NETWORK: _stack_networks([p.inputs[NETWORK] for p in plans])}
    for name in _STACKED:
        values = [p.inputs[name] for p in plans]
        inputs[name] = None if values[0] is None else torch.cat(values, dim=0)
    inputs["guidance_scale"] = _stack_scales(plans, inputs["latents"])
    out: Tensor = first.call(**inputs)
    sizes = [p.inputs["latents"].shape[0] for p in plans]
    return list(out.split(sizes, dim=0))


def _stack_networks(networks: list[Any]) -> Any:
    stack = getattr(networks[0], "stack", None)
    return stack(networks) if callable(stack) else networks[0]


def _stack_scales(plans: Sequence[StepPlan], latents: Tensor) -> float | Tensor:
    """One float when every request guides alike (the unbatched arithmetic exactly), else a
    float32 [B, 1, ...] tensor broadcasting over each sample."""
    scales = [p.inputs["guidance_scale"] for p in plans]
    if all(isinstance(s, (int, float)) for s in scales) and len(set(scales)) == 1:
        return float(scales[0])
    per_sample = []
    for plan, scale in zip(plans, scales):
        value = scale.float().reshape(()) if isinstance(scale, Tensor) else torch.tensor(float(scale))
        per_sample.append(value.expand(plan.inputs["latents"].shape[0]))
    shape = (-1,) + (1,) * (latents.dim() - 1)
    return torch.cat(per_sample).to(latents.device).reshape(shape)


class BatchStats:
    """How many forwards the batch policy ran and how many request-steps they carried (worker thread only)."""

    def __init__(self) -> None:
        self.forwards = 0
        self.steps = 0
        self.largest = 0

    def add(self, size: int) -> None:
        self.forwards += 1
        self.steps += size
        self.largest = max(self.largest, size)

    def summary(self) -> dict[str, float]:
        mean = self.steps / self.forwards if self.forwards else 0.0
        return {"forwards": self.forwards, "request_steps": self.steps, "mean_batch": round(mean, 3),
                "largest_batch": self.largest}
