"""CFG policies: batched CFG is classic CFG run as one forward of batch 2."""

from __future__ import annotations

import pytest
import torch

from vidloom.core.errors import DeployError
from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.diffusion.guidance import BatchedCFG, ParallelCFG, SequentialCFG, cfg_combine, make_guidance
from vidloom.generator import VideoGenerator

# fp32 on CPU: batch 2 changes how the matmuls are blocked (summation order), not the math;
# observed <= 3e-6 on guided velocities (scale 5 amplifies it). 1e-5 catches any branch mix-up (>1e-1).
FP32_TOL = 1e-5


def test_combine_rule():
    cond, uncond = torch.tensor([2.0, 1.0]), torch.tensor([1.0, 1.0])
    assert torch.equal(cfg_combine(cond, uncond, 5.0), torch.tensor([6.0, 1.0]))


def test_unknown_mode_lists_the_known_ones():
    with pytest.raises(DeployError, match="unknown cfg_mode 'parallel'; known: sequential, batched"):
        make_guidance("parallel")


def _step_inputs(transformer) -> dict:
    cfg = transformer.config
    g = torch.Generator().manual_seed(0)
    return dict(
        latents=torch.randn(1, cfg.in_channels, 3, 4, 6, generator=g),
        timestep=torch.tensor([731.5]),
        prompt_embeds=torch.randn(1, 512, cfg.text_dim, generator=g),
        negative_embeds=torch.randn(1, 512, cfg.text_dim, generator=g),
        guidance_scale=5.0,
    )


def test_batched_matches_sequential_on_tiny_checkpoints(tiny_wan_dir):
    transformer = VideoGenerator.from_pretrained(tiny_wan_dir, device="cpu").engine.instance["transformer"]
    inputs = _step_inputs(transformer)
    calls: list[int] = []

    def network(latents, timestep, text_embeds):
        calls.append(latents.shape[0])
        return transformer(latents, timestep, text_embeds)

    with torch.inference_mode():
        sequential = SequentialCFG()(network, **inputs)
        batched = BatchedCFG()(network, **inputs)
        unguided = BatchedCFG()(network, **{**inputs, "negative_embeds": None})
    assert calls == [1, 1, 2, 1]  # two forwards of batch 1, then one of batch 2
    assert sequential.abs().max() > 0.1
    diff = (batched - sequential).abs().max().item()
    assert diff <= FP32_TOL, f"batched vs sequential CFG: {diff:.3e}"
    with torch.inference_mode():
        assert torch.equal(unguided, transformer(inputs["latents"], inputs["timestep"], inputs["prompt_embeds"]))


def test_parallel_cfg_runs_one_branch_per_rank_and_both_ranks_agree_with_sequential():
    torch.manual_seed(0)
    weights = torch.randn(6, 6)
    seen: dict[int, list[float]] = {0: [], 1: []}

    def network_of(rank):
        def network(latents, timestep, text_embeds):
            seen[rank].append(float(text_embeds.sum()))
            return (latents.flatten(1) @ weights).reshape(latents.shape) + text_embeds.mean()
        return network

    inputs = dict(latents=torch.randn(1, 6), timestep=torch.tensor([500.0]), prompt_embeds=torch.ones(1, 2, 3),
                  negative_embeds=torch.zeros(1, 2, 3), guidance_scale=5.0)
    sequential = SequentialCFG()(network_of(0), **inputs)
    seen[0].clear()
    outs = run_ranks(thread_group(2), lambda pair: ParallelCFG(pair)(network_of(pair.rank), **inputs))
    assert seen == {0: [6.0], 1: [0.0]}  # rank 0 ran the cond branch only, rank 1 the uncond one
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], sequential)  # same ops, exchanged exactly


def test_parallel_cfg_needs_a_pair_and_a_negative_branch():
    with pytest.raises(ValueError, match="two ranks or more"):
        ParallelCFG(thread_group(1)[0])
    # A group of three is for a program that spreads more passes (LTX-2); classic CFG's branches need two.
    three = ParallelCFG(thread_group(3)[0])
    with pytest.raises(ValueError, match="classic CFG has two branches"):
        three.branches(lambda *x: x[0], torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1))
    (a, _) = thread_group(2)
    with pytest.raises(ValueError, match="guidance_scale must be > 1"):
        ParallelCFG(a)(lambda *x: x[0], torch.zeros(1), torch.zeros(1), torch.zeros(1), None, 1.0)
