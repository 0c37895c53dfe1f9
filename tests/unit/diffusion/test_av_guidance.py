"""The LTX-2 guidance policy on a fake network: which passes run, and what the terms add up to."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.diffusion.av_guidance import AudioVideoGuidance, AudioVideoScales, SplitAudioVideoGuidance

OFF = dict(video_stg=0.0, audio_stg=0.0, video_modality=1.0, audio_modality=1.0, video_rescale=0.0,
           audio_rescale=0.0)


class Text:
    def __init__(self, value: float) -> None:
        self.value = value

    def cat(self, other: "Text") -> list["Text"]:
        return [self, other]


class FakeNetwork:
    """Velocity = text value (+ 1 when perturbed, + 2 when isolated); records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool, frozenset[int]]] = []

    def __call__(self, video, audio, text, timestep, audio_timestep, *, isolate=False, skip=frozenset()):
        self.calls.append((video.shape[0], isolate, skip))
        texts = text if isinstance(text, list) else [text]
        offset = (1.0 if skip else 0.0) + (2.0 if isolate else 0.0)
        v = torch.cat([torch.full_like(video[:1], t.value + offset) for t in texts])
        a = torch.cat([torch.full_like(audio[:1], 10 * t.value + offset) for t in texts])
        return v, a


def _run(scales: AudioVideoScales, negative: Text | None = Text(0.0)):
    net = FakeNetwork()
    video, audio = torch.zeros(1, 4, 2), torch.zeros(1, 3, 2)
    t = torch.tensor([500.0])
    v, a = AudioVideoGuidance()(net, video, audio, t, t, torch.tensor(0.5), Text(1.0), negative, scales)
    return v, a, net.calls


def test_cfg_alone_is_classic_cfg_per_stream():
    v, a, calls = _run(AudioVideoScales(video_cfg=3.0, audio_cfg=7.0, **OFF))
    assert calls == [(2, False, frozenset())]  # one batched forward: [negative, prompt]
    assert torch.allclose(v, torch.full_like(v, 0.0 + 3.0 * (1.0 - 0.0)))
    assert torch.allclose(a, torch.full_like(a, 0.0 + 7.0 * (10.0 - 0.0)))


def test_stg_and_modality_passes_run_with_their_perturbation():
    scales = AudioVideoScales(video_cfg=1.0, audio_cfg=1.0, video_stg=1.0, audio_stg=0.5, video_modality=3.0,
                              audio_modality=3.0, video_rescale=0.0, audio_rescale=0.0, stg_blocks=(2,))
    v, a, calls = _run(scales, negative=None)
    assert calls == [(1, False, frozenset()), (1, False, frozenset({2})), (1, True, frozenset())]
    # Terms added in x0 space (x0 = sample - sigma v) come back as v_c + w (v_c - v_perturbed).
    assert torch.allclose(v, torch.full_like(v, 1.0 + 1.0 * (1.0 - 2.0) + 2.0 * (1.0 - 3.0)))
    assert torch.allclose(a, torch.full_like(a, 10.0 + 0.5 * (10.0 - 11.0) + 2.0 * (10.0 - 12.0)))


def test_no_guidance_is_the_conditional_velocity():
    v, a, calls = _run(AudioVideoScales(video_cfg=1.0, audio_cfg=1.0, **OFF), negative=None)
    assert len(calls) == 1
    assert torch.allclose(v, torch.ones_like(v)) and torch.allclose(a, torch.full_like(a, 10.0))


ALL_PASSES = AudioVideoScales(video_cfg=3.0, audio_cfg=7.0, video_stg=1.0, audio_stg=0.5, video_modality=3.0,
                              audio_modality=2.0, stg_blocks=(2,))


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize(("scales", "negative"), [
    (ALL_PASSES, Text(0.0)),  # four passes
    (AudioVideoScales(video_cfg=3.0, audio_cfg=7.0, video_stg=0.0, audio_stg=0.0), Text(0.0)),  # cond, uncond, isolated
    (AudioVideoScales(video_cfg=1.0, audio_cfg=1.0, **OFF), None),  # one pass (a distilled stage): on every rank
])
def test_split_passes_combine_to_the_one_device_step_on_every_rank(size, scales, negative):
    """--cfg-parallel: pass j on rank j mod size, one sample per forward; every rank gathers all and combines alike."""
    g = torch.Generator().manual_seed(0)
    video, audio = torch.randn(1, 4, 2, generator=g), torch.randn(1, 3, 2, generator=g)
    t, sigma = torch.tensor([500.0]), torch.tensor(0.5)
    want = AudioVideoGuidance()(FakeNetwork(), video, audio, t, t, sigma, Text(1.0), negative, scales)
    networks = [FakeNetwork() for _ in range(size)]

    def rank(comm):
        step = SplitAudioVideoGuidance(comm)
        return step(networks[comm.rank], video, audio, t, t, sigma, Text(1.0), negative, scales)

    for got in run_ranks(thread_group(size), rank):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    calls = [len(net.calls) for net in networks]
    passes = 1 + (negative is not None) + scales.stg + scales.modality
    assert calls == ([1] * size if passes == 1 else [len(range(r, passes, size)) for r in range(size)])
    assert all(batch == 1 for net in networks for batch, *_ in net.calls)
    if passes > 1:
        assert networks[0].calls[0] == (1, False, frozenset())  # rank 0 runs the conditional pass
