"""GraphedStep on CPU with a stand-in capturer: fallback on a failed capture, replay semantics, and
guidance-scale arithmetic identical between graph and eager (the CUDA run is in tests/gpu/)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
import torch

from tests.helpers.graph_capturer import RecordingCapturer
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.core.parallel import ParallelPlan
from vidloom.diffusion.guidance import BatchedCFG, SequentialCFG
from vidloom.runtime.cudagraph import GraphedStep, StepGraphs

CPU = torch.device("cpu")


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


def _prompted(x: torch.Tensor, prompt: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale + prompt.sum()


def test_graphs_of_one_step_share_the_static_inputs_of_equal_shape():
    """Two signatures (latent sizes) read a prompt of one shape: one static buffer serves both graphs, and each
    replay, alternating between them, still reads its own call's values (every replay copies all its inputs in)."""
    graphed = GraphedStep(_prompted, CPU, RecordingCapturer())
    small, large = torch.randn(2, 3), torch.randn(4, 3)
    for i in range(3):
        for x in (small, large):
            prompt = torch.full((5, 8), float(i + x.shape[0]))
            assert torch.equal(graphed(x=x, prompt=prompt, scale=0.5 * i), _prompted(x, prompt, 0.5 * i))
    assert graphed.captures == 2 and graphed.replays == 6
    small_inputs, large_inputs = (captured.buffers for captured in graphed._graphs.values())
    shared = [a is b for a, b in zip(small_inputs, large_inputs)]
    assert shared == [True, True, False]  # leaves by name: the prompt and the scale share a buffer, x differs
    assert len(graphed._inputs) == 4


class _BoundNetwork:
    """A per-request network view (like Flux2's or Wan I2V's): a shared weight plus the request's own tokens."""

    def __init__(self, weight: torch.Tensor, tokens: torch.Tensor, offset: int) -> None:
        self.weight, self.tokens, self.offset = weight, tokens, offset

    def graph_split(self):
        return (id(self.weight), self.offset), (self.tokens,)

    def graph_rebuild(self, parts):
        return _BoundNetwork(self.weight, parts[0], self.offset)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.tokens.sum(0) + self.offset


@dataclass(frozen=True)
class _Text:
    """A text batch: tensor fields are graph leaves, plain fields part of the signature."""

    embeds: torch.Tensor
    scale: float


@dataclass(frozen=True)
class _Scales:
    video: float
    audio: float


def _two_streams(network: _BoundNetwork, video: torch.Tensor, audio: torch.Tensor | None,
                 texts: tuple[torch.Tensor, ...], prompt: _Text, scales: _Scales, mode: str) -> dict[str, object]:
    v = network(video) * scales.video + texts[0].mean() + prompt.embeds * prompt.scale
    a = None if audio is None else audio * scales.audio + texts[1].mean()
    return {"video": v, "pair": (v * 2, a), "mode": mode}


def test_structured_inputs_and_outputs_replay_per_request_tensors():
    weight = torch.randn(4, 4)
    capturer = RecordingCapturer()
    graphed = GraphedStep(_two_streams, CPU, capturer)

    def inputs(seed: int, audio: bool = True, scales: _Scales = _Scales(2.0, 3.0), offset: int = 1,
               text_scale: float = 0.5):
        gen = torch.Generator().manual_seed(seed)
        return dict(network=_BoundNetwork(weight, torch.randn(3, 4, generator=gen), offset),
                    video=torch.randn(2, 4, generator=gen), audio=torch.randn(5, generator=gen) if audio else None,
                    texts=(torch.randn(6, generator=gen), torch.randn(6, generator=gen)),
                    prompt=_Text(torch.randn(4, generator=gen), text_scale), scales=scales, mode="av")

    def same(got, want) -> bool:
        return (torch.equal(got["video"], want["video"]) and torch.equal(got["pair"][0], want["pair"][0])
                and (got["pair"][1] is want["pair"][1] is None or torch.equal(got["pair"][1], want["pair"][1]))
                and got["mode"] == want["mode"])

    for seed in range(3):  # one capture; the later requests' own tokens, latents and texts are what the replay reads
        request = inputs(seed)
        assert same(graphed(**request), _two_streams(**request))
    assert (capturer.calls, graphed.captures, graphed.replays) == (1, 1, 3)
    first = graphed(**inputs(0))
    assert not first["video"].data_ptr() == graphed(**inputs(1))["video"].data_ptr(), "outputs are copies"
    # Each change of signature captures anew: a None input, a guidance value a step may branch on, a fixed field of
    # a bound object, a plain field of a text batch, a shape.
    for changed in (inputs(4, audio=False), inputs(4, scales=_Scales(2.0, 4.0)), inputs(4, offset=2),
                    inputs(4, text_scale=0.25)):
        assert same(graphed(**changed), _two_streams(**changed))
    wide = inputs(5)
    wide["video"] = torch.randn(3, 4)
    assert same(graphed(**wide), _two_streams(**wide))
    assert capturer.calls == graphed.captures == 6 and graphed.fallbacks == 0


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
