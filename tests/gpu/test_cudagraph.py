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


def test_graphed_step_rejects_cpu():
    from vidloom.runtime.cudagraph import GraphedStep

    with pytest.raises(ValueError):
        GraphedStep(lambda: None, torch.device("cpu"))
