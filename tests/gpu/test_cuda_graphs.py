"""CUDA graphs on a real device: replay equals eager, guidance at a non-bf16 scale, failed-capture fallback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch


def test_graphed_step_matches_eager_and_reuses_the_graph():
    from vidloom.runtime.cudagraph import GraphedStep

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).cuda()

    def step(latents: torch.Tensor, scale: torch.Tensor | float, other: torch.Tensor | None) -> torch.Tensor:
        out = layer(latents) * scale
        return out if other is None else out + other

    graphed = GraphedStep(step, torch.device("cuda"))
    for i in range(3):
        x = torch.randn(4, 64, device="cuda")
        with torch.inference_mode():
            expected = step(x, 1.5 + i, None)
            got = graphed(latents=x, scale=1.5 + i, other=None)
        assert torch.allclose(got, expected, atol=1e-6)
    assert graphed.captures == 1 and graphed.replays == 3 and graphed.fallbacks == 0


def test_graph_and_eager_cfg_agree_bitwise_at_guidance_4_2_in_bf16():
    from vidloom.diffusion.guidance import SequentialCFG
    from vidloom.runtime.cudagraph import GraphedStep

    torch.manual_seed(1)
    layer = torch.nn.Linear(64, 64).cuda().bfloat16()

    def network(latents, timestep, embeds):
        return layer(latents) + embeds

    inputs = dict(network=network, latents=torch.randn(2, 64, 64, device="cuda").bfloat16(),
                  timestep=torch.tensor([500.0], device="cuda"),
                  prompt_embeds=torch.randn(2, 64, 64, device="cuda").bfloat16(),
                  negative_embeds=torch.randn(2, 64, 64, device="cuda").bfloat16())
    policy = SequentialCFG()
    graphed = GraphedStep(policy, torch.device("cuda"))
    with torch.inference_mode():
        eager = policy(**inputs, guidance_scale=4.2)
        for _ in range(2):
            assert torch.equal(graphed(**inputs, guidance_scale=4.2), eager)


def test_a_failed_capture_falls_back_to_eager_with_a_warning():
    # In a fresh process: a capture that syncs is invalidated, and the rest of this suite must
    # not share a CUDA context with it.
    script = textwrap.dedent("""
        import logging, torch
        from vidloom.runtime.cudagraph import GraphedStep
        logging.basicConfig(level=logging.WARNING)
        def step(x):
            y = x * 2
            if y.sum().item() > 1e30:  # a device->host sync: illegal while capturing
                y = y + 1
            return y
        graphed = GraphedStep(step, torch.device("cuda"))
        x = torch.ones(8, device="cuda")
        for _ in range(2):
            assert torch.equal(graphed(x=x), x * 2)
        assert graphed.fallbacks == 1 and graphed.captures == 0, (graphed.fallbacks, graphed.captures)
        assert torch.cuda.current_stream() == torch.cuda.default_stream(), "the capture stream was left current"
        torch.cuda.synchronize()
        print("OK")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-2000:]
    assert "capture failed" in proc.stderr


@pytest.mark.parametrize("guidance", [5.0, 4.2])
def test_cuda_graph_generation_matches_eager(demo_cache, guidance):
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.request import GenerationRequest
    from vidloom.generator import VideoGenerator

    request = dict(prompt="a fox", height=32, width=48, num_frames=5, num_inference_steps=3, seed=1,
                   guidance_scale=guidance)
    eager = VideoGenerator.from_pretrained("wan2.1-demo", device="cuda", cache_dir=demo_cache)
    graphed = VideoGenerator.from_pretrained("wan2.1-demo", device="cuda", cache_dir=demo_cache,
                                             deploy=DeployConfig(cuda_graphs=True))
    a = eager.engine.run(GenerationRequest(**request))["video"]
    b = graphed.engine.run(GenerationRequest(**request))["video"]
    assert a.dtype == b.dtype == np.uint8  # converted on the device
    # Same kernels replayed with the same guidance arithmetic: at most one uint8 level apart.
    assert np.abs(a.astype(np.int16) - b.astype(np.int16)).max() <= 1
    stats = graphed.engine.graph_stats
    assert stats["captures"] >= 1 and stats["fallbacks"] == 0 and stats["replays"] == 3


def test_a_capture_charges_its_pool_growth_and_inputs_and_forgetting_the_last_graph_frees_them():
    """runtime.graph_memory on a real device: the pool's growth, read from the allocator once after the capture, covers
    the captured step's output; the static inputs are charged exactly; dropping the last graph releases both."""
    from vidloom.runtime.admission import MemoryAdmission
    from vidloom.runtime.cudagraph import StepGraphs
    from vidloom.runtime.graph_memory import GRAPHS_KIND

    layer = torch.nn.Linear(256, 1024).cuda()
    graphs, ledger = StepGraphs(torch.device("cuda")), MemoryAdmission(1 << 40)
    graphs.memory.attach(ledger)
    step = graphs.get(lambda x: torch.relu(layer(x)) * 2)
    x = torch.randn(512, 256, device="cuda")
    with torch.inference_mode():
        step(x=x)
        step(x=x)
    output = 512 * 1024 * 4
    assert step.captures == 1 and step.replays == 2
    assert graphs.memory.pool_bytes >= output
    assert ledger.held_by(GRAPHS_KIND) == graphs.memory.pool_bytes + x.numel() * 4
    assert graphs.make_room(ledger) and ledger.in_use == 0 and graphs.memory.pool_bytes == 0
