"""runtime.batching with fake networks: which plans stack, and how inputs and guidance scales stack."""

from __future__ import annotations

import torch

from vidloom.core.loop import NETWORK, StepPlan
from vidloom.diffusion.guidance import SequentialCFG
from vidloom.runtime.batching import batch_key, run_batched

GUIDE = SequentialCFG()


def net(latents, timestep, text):
    # Depends on every per-sample input, so a mixed-up stacking changes the result.
    return latents * timestep[:, None] + text.mean(dim=(1, 2))[:, None]


def plan(seed: int, scale: float = 1.0, cfg: bool = False, shape=(1, 4), network=net) -> StepPlan:
    g = torch.Generator().manual_seed(seed)
    return StepPlan("denoise", 0, 2, GUIDE, {
        NETWORK: network, "latents": torch.randn(shape, generator=g), "timestep": torch.rand(1, generator=g),
        "prompt_embeds": torch.randn(1, 3, 2, generator=g),
        "negative_embeds": torch.randn(1, 3, 2, generator=g) if cfg else None, "guidance_scale": scale,
    })


def test_keys_separate_shapes_cfg_and_networks():
    assert batch_key(plan(0)) == batch_key(plan(1))
    assert batch_key(plan(0)) != batch_key(plan(1, shape=(1, 5)))
    assert batch_key(plan(0)) != batch_key(plan(1, cfg=True))
    assert batch_key(plan(0)) != batch_key(plan(1, network=lambda *a: None))
    odd = StepPlan("denoise", 0, 1, GUIDE, {"x": 1})
    assert batch_key(odd) is None


def test_stacked_results_equal_single_results_with_per_sample_scales():
    plans = [plan(0, 2.0, cfg=True), plan(1, 5.0, cfg=True), plan(2, 5.0, cfg=True)]
    together = run_batched(plans)
    for p, result in zip(plans, together):
        assert torch.allclose(result, p.call(**p.inputs), atol=1e-6)
