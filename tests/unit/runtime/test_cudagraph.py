"""GraphedStep on CPU with a stand-in capturer: fallback on a failed capture, replay semantics, and
guidance-scale arithmetic identical between graph and eager (the CUDA run is in tests/gpu/)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

import pytest
import torch

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.core.parallel import ParallelPlan
from vidloom.diffusion.guidance import BatchedCFG, SequentialCFG
from vidloom.runtime.cudagraph import GraphedStep, StepGraphs

CPU = torch.device("cpu")


class _Replay:
    """A CUDA graph's contract on CPU: the output buffer is recomputed from the static inputs."""

    def __init__(self, call: Callable[..., torch.Tensor], static: Mapping[str, Any]) -> None:
        self.call, self.static = call, static
        self.output = call(**static)

    def replay(self) -> None:
        self.output.copy_(self.call(**self.static))


class RecordingCapturer:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls = 0

    def __call__(self, call: Callable[..., torch.Tensor], static: Mapping[str, Any]) -> _Replay:
        self.calls += 1
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return _Replay(call, static)


def _step(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    return x * 2 + scale


def test_failed_capture_falls_back_to_eager_for_that_signature_with_a_warning(caplog):
    capturer = RecordingCapturer(fail=True)
    graphed = GraphedStep(_step, CPU, capturer)
    x = torch.randn(3, 4)
    with caplog.at_level(logging.WARNING, logger="vidloom.runtime.cudagraph"):
        first = graphed(x=x, scale=0.5)
        second = graphed(x=x + 1, scale=1.5)
    assert torch.equal(first, _step(x, 0.5)) and torch.equal(second, _step(x + 1, 1.5))
    assert capturer.calls == 1, "a signature whose capture failed is not retried"
    assert (graphed.fallbacks, graphed.captures, graphed.replays) == (1, 0, 0)
    assert "capture failed" in caplog.text and "x=(3, 4)" in caplog.text
    # A different signature still gets its own capture attempt.
    capturer.fail = False
    assert torch.equal(graphed(x=torch.ones(2, 2), scale=1.0), _step(torch.ones(2, 2), 1.0))
    assert capturer.calls == 2 and graphed.captures == 1


def test_replay_copies_fresh_inputs_into_the_static_buffers():
    capturer = RecordingCapturer()
    graphed = GraphedStep(_step, CPU, capturer)
    outputs = []
    for i in range(3):
        x = torch.full((2, 3), float(i))
        out = graphed(x=x, scale=0.25 * i)
        assert torch.equal(out, _step(x, 0.25 * i))
        outputs.append(out)
    assert capturer.calls == 1 and graphed.replays == 3
    assert not torch.equal(outputs[0], outputs[2]), "each call returns its own copy, not the shared buffer"


class _Bf16Network:
    """A stand-in DiT in bfloat16: CFG's combine then runs on bf16 predictions, as on GPU."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.weight = torch.randn(8, 8, generator=gen).bfloat16()

    def __call__(self, latents: torch.Tensor, timestep: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        return latents @ self.weight + embeds


@pytest.mark.parametrize("policy", [SequentialCFG(), BatchedCFG()], ids=["sequential", "batched"])
def test_graph_and_eager_guidance_agree_at_a_scale_bf16_cannot_represent(policy):
    # 4.2 is not a bf16 number (bf16 rounds it to 4.1875). Eager multiplies in float32 with the
    # Python float; the graph holds it as a 0-dim float32 tensor. Both must give the same bits.
    assert torch.tensor(4.2).bfloat16().item() == 4.1875
    network = _Bf16Network()
    gen = torch.Generator().manual_seed(1)
    inputs = dict(
        network=network,
        latents=torch.randn(1, 64, 8, generator=gen).bfloat16(),
        timestep=torch.tensor([500.0]),
        prompt_embeds=torch.randn(1, 64, 8, generator=gen).bfloat16(),
        negative_embeds=torch.randn(1, 64, 8, generator=gen).bfloat16(),
    )
    eager = policy(**inputs, guidance_scale=4.2)
    graphed = GraphedStep(policy, CPU, RecordingCapturer())
    assert torch.equal(graphed(**inputs, guidance_scale=4.2), eager)
    assert torch.equal(graphed(**inputs, guidance_scale=4.2), eager)  # replayed, not only captured
    assert graphed.captures == 1 and graphed.replays == 2
    # The arithmetic this guards against: a 0-dim float32 tensor times bf16 rounds the scale to bf16.
    cond = network(inputs["latents"], inputs["timestep"], inputs["prompt_embeds"])
    uncond = network(inputs["latents"], inputs["timestep"], inputs["negative_embeds"])
    naive = uncond + torch.tensor(4.2) * (cond - uncond)
    assert not torch.equal(naive, eager)


def test_step_graphs_need_cuda_unless_given_a_capturer():
    with pytest.raises(DeployError, match="cuda_graphs needs a CUDA device"):
        StepGraphs(CPU)
    graphs = StepGraphs(CPU, RecordingCapturer())
    assert graphs.get(_step) is graphs.get(_step)
    for _ in range(2):
        graphs.get(_step)(x=torch.ones(2), scale=1.0)
    assert graphs.totals() == {"captures": 1, "replays": 2, "fallbacks": 0}


@pytest.mark.parametrize("plan", [ParallelPlan(sp=2), ParallelPlan(cfg=2)], ids=["sp", "cfg"])
def test_cuda_graphs_with_a_parallel_plan_are_refused_at_load(plan):
    with pytest.raises(DeployError, match="cuda_graphs cannot run with a parallel plan"):
        DeployConfig(cuda_graphs=True, devices=plan.world_size, parallel=plan)
    DeployConfig(cuda_graphs=True)  # one device: allowed (the CUDA check comes at load)


def test_cuda_graphs_are_refused_at_load_without_cuda(demo_cache):
    from vidloom.generator import VideoGenerator

    with pytest.raises(DeployError, match="cuda_graphs needs a CUDA device"):
        VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache,
                                       deploy=DeployConfig(cuda_graphs=True))
