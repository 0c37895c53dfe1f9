"""runtime.batching with fake networks: which plans stack, and how inputs and guidance scales stack.

Keys come from each plan's declaration (StepPlan.denoiser), so two families with different inputs both batch.
"""

from __future__ import annotations

import torch

from vidloom.core.denoiser import GUIDANCE_INPUTS, DenoiseInputs
from vidloom.core.loop import NETWORK, StepPlan
from vidloom.diffusion.guidance import SequentialCFG
from vidloom.runtime.batching import batch_key, run_batched, stacked_bytes

GUIDE = SequentialCFG()


def net(latents, timestep, text):
    # Depends on every per-sample input, so a mixed-up stacking changes the result.
    return latents * timestep[:, None] + text.mean(dim=(1, 2))[:, None]


def plan(seed: int, scale: float = 1.0, cfg: bool = False, shape=(1, 4), network=net) -> StepPlan:
    g = torch.Generator().manual_seed(seed)
    return StepPlan("denoise", 0, 2, GUIDE, denoiser=GUIDANCE_INPUTS, inputs={
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
    undeclared = plan(0)
    assert batch_key(StepPlan("denoise", 0, 2, GUIDE, undeclared.inputs)) is None  # no declaration: runs alone


def test_stacked_results_equal_single_results_with_per_sample_scales():
    plans = [plan(0, 2.0, cfg=True), plan(1, 5.0, cfg=True), plan(2, 5.0, cfg=True)]
    together = run_batched(plans)
    for p, result in zip(plans, together):
        assert torch.allclose(result, p.call(**p.inputs), atol=1e-6)


# A second family, unlike the guidance policy: two streams, a text object that stacks itself, a per-request
# option that must match, one scale, and a tuple result.


class Text:
    """A per-sample input that is not a tensor: it declares its own batch key and stack."""

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values

    def batch_key(self):
        return tuple(self.values.shape[1:])

    @staticmethod
    def stack(texts):
        return Text(torch.cat([t.values for t in texts]))


AV_INPUTS = DenoiseInputs(("video", "audio", "t", "text"), ("scale",))


def av_step(network, video, audio, t, text, scale, isolate):
    v, a = network(video, audio, t, text)
    return v * scale, a + (1.0 if isolate else 0.0)


def av_net(video, audio, t, text):
    return video * t[:, None] + text.values.mean(dim=1), audio - t[:, None]


def av_plan(seed: int, scale: float = 1.0, isolate: bool = False, frames: int = 3) -> StepPlan:
    g = torch.Generator().manual_seed(seed)
    return StepPlan("stage1", 0, 2, av_step, denoiser=AV_INPUTS, inputs={
        NETWORK: av_net, "video": torch.randn(1, 4, generator=g), "audio": torch.randn(1, frames, generator=g),
        "t": torch.rand(1, generator=g), "text": Text(torch.randn(1, 2, 4, generator=g)), "scale": scale,
        "isolate": isolate,
    })


def test_a_second_familys_declaration_gives_its_own_keys():
    assert batch_key(av_plan(0)) == batch_key(av_plan(1, scale=3.0))  # scales are per sample
    assert batch_key(av_plan(0)) != batch_key(av_plan(1, isolate=True))  # undeclared inputs must be equal
    assert batch_key(av_plan(0)) != batch_key(av_plan(1, frames=4))  # per-sample shapes must stack
    assert batch_key(av_plan(0)) != batch_key(plan(0))  # the two families never share a forward


def test_a_second_familys_stacked_results_equal_single_results():
    plans = [av_plan(0, 2.0), av_plan(1, 5.0), av_plan(2, 2.0)]
    together = run_batched(plans)
    for p, (video, audio) in zip(plans, together):
        alone_video, alone_audio = p.call(**p.inputs)
        assert torch.allclose(video, alone_video, atol=1e-6) and torch.allclose(audio, alone_audio, atol=1e-6)


def test_stacked_bytes_count_every_copy_a_shared_forward_makes():
    """runtime.batching.stacked_bytes: the per-sample tensors a batched forward concatenates, values that declare
    `stacked_bytes` (a PromptKV: all of it), nothing for a shared module, nothing for one plan (it stacks nothing)."""
    from vidloom.layers.prompt_kv import PromptKV

    plans = [plan(0, cfg=True), plan(1, cfg=True)]
    per_plan = (4 + 1 + 6 + 6) * 4  # latents [1, 4], timestep [1], both embeddings [1, 3, 2], float32
    assert stacked_bytes(plans) == 2 * per_plan and stacked_bytes(plans[:1]) == 0
    kv = PromptKV((torch.zeros(1, 3, 2, 4),), (torch.zeros(1, 3, 2, 4),))
    for p in plans:
        p.inputs["prompt_embeds"] = kv
    stacked = PromptKV.stack([kv, kv])
    assert kv.stacked_bytes == kv.nbytes and stacked.nbytes == 2 * kv.stacked_bytes
    assert stacked_bytes(plans) == 2 * (per_plan - 6 * 4) + stacked.nbytes
