"""CUDA-graph replay of a step body equals eager execution (skipped without CUDA)."""

import pytest
import torch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
def test_graphed_step_matches_eager_and_reuses_the_graph():
    from vidloom.runtime.cudagraph import GraphedStep

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).cuda()

    def step(latents: torch.Tensor, scale: torch.Tensor, other: torch.Tensor | None) -> torch.Tensor:
        out = layer(latents) * scale
        return out if other is None else out + other

    graphed = GraphedStep(step, torch.device("cuda"))
    for i in range(3):
        x = torch.randn(4, 64, device="cuda")
        with torch.inference_mode():
            expected = step(x, torch.tensor(1.5 + i, device="cuda"), None)
            got = graphed(latents=x, scale=1.5 + i, other=None)
        assert torch.allclose(got, expected, atol=1e-6)
    assert graphed.captures == 1 and graphed.replays == 3


def test_cuda_graphs_are_refused_at_load_without_cuda(demo_cache):
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.errors import DeployError
    from vidloom.generator import VideoGenerator
    from vidloom.runtime.cudagraph import GraphedStep

    with pytest.raises(DeployError):
        GraphedStep(lambda: None, torch.device("cpu"))
    with pytest.raises(DeployError, match="cuda_graphs needs a CUDA device"):
        VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache,
                                       deploy=DeployConfig(cuda_graphs=True))


@needs_cuda
def test_cuda_graph_generation_matches_eager(demo_cache):
    import numpy as np

    from vidloom.core.deploy import DeployConfig
    from vidloom.core.request import GenerationRequest
    from vidloom.generator import VideoGenerator

    request = dict(prompt="a fox", height=32, width=48, num_frames=5, num_inference_steps=3, seed=1)
    eager = VideoGenerator.from_pretrained("wan2.1-demo", device="cuda", cache_dir=demo_cache)
    graphed = VideoGenerator.from_pretrained("wan2.1-demo", device="cuda", cache_dir=demo_cache,
                                             deploy=DeployConfig(cuda_graphs=True))
    a = eager.engine.run(GenerationRequest(**request))["video"]
    b = graphed.engine.run(GenerationRequest(**request))["video"]
    assert np.abs(a - b).max() <= 1e-4  # same kernels replayed; bf16/tf32 reorderings only
