"""End-to-end parity: Wan video-to-video (input video + strength) vs diffusers' WanVideoToVideoPipeline."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.parity import ParityRun, run_parity

TOLERANCE = 1e-4  # as the T2V parity tests (fp32 CPU)
PROMPT = "a red fox jumps over a frozen river"
NEGATIVE = "blurred, low quality"
CASES = {
    # frames larger than the request and not its aspect: both sides resize each frame (Lanczos)
    "unipc-nonsquare": dict(sampler="unipc", height=32, width=48, frames=9, steps=5, strength=0.7, guidance=5.0,
                            seed=42, size=(70, 40)),
    "euler-tall": dict(sampler="euler", height=48, width=16, frames=5, steps=4, strength=0.5, guidance=4.0,
                       seed=7, size=(20, 52)),
}


def _video(n: int, size: tuple[int, int], seed: int) -> list:
    return [make_image(*size, seed=seed + i) for i in range(n)]


def _request(video, **kw) -> GenerationRequest:
    return GenerationRequest(
        prompt=PROMPT, negative_prompt=NEGATIVE, video=video, strength=kw["strength"], height=kw["height"],
        width=kw["width"], num_inference_steps=kw["steps"], guidance_scale=kw["guidance"], flow_shift=3.0,
        sampler=kw["sampler"], seed=kw["seed"],
    )


def _ours(gen, video, **kw) -> np.ndarray:
    return gen.engine.run(_request(video, **kw))["video"]


def _compare(folder, gen, video, **kw) -> ParityRun:
    """Both sides through the parity tool (an input video picks WanVideoToVideoPipeline on the folder):
    a failure names the first diverging step, call and block."""
    return run_parity(folder, _request(video, **kw), generator=gen)


@pytest.mark.parametrize("case", list(CASES))
def test_v2v_matches_diffusers(tiny_wan_dir, case):
    kw = CASES[case]
    video = _video(kw["frames"], kw["size"], seed=3)
    gen = VideoGenerator.from_pretrained(tiny_wan_dir, device="cpu")
    result = _compare(tiny_wan_dir, gen, video, **kw)
    expected, got, report = result.theirs, result.ours, result.report.format()
    assert got.shape == expected.shape == (kw["frames"], kw["height"], kw["width"], 3), report
    diff = float(np.abs(got - expected).max())
    assert diff <= TOLERANCE, f"{case}: max abs diff {diff:.3e}\n{report}"
    assert result.report.ok, report
    # The input video and the strength must both steer the result.
    other_video = _ours(gen, _video(kw["frames"], kw["size"], seed=11), **kw)
    assert float(np.abs(other_video - got).max()) > 1e-2  # 100x the tolerance
    weaker = _ours(gen, video, **{**kw, "strength": 0.25 if kw["steps"] >= 4 else 0.5})
    assert float(np.abs(weaker - got).max()) > 1e-3


def test_v2v_bad_inputs_name_the_field(tiny_wan_dir):
    gen = VideoGenerator.from_pretrained(tiny_wan_dir, device="cpu")
    frames = _video(5, (32, 32), seed=0)
    cases = [
        (dict(video=frames, strength=0.0), "strength"),
        (dict(video=frames, strength=1.5), "strength"),
        (dict(video=frames, strength=0.1, num_inference_steps=4), "strength"),  # no step left
        (dict(strength=0.5), "strength"),  # strength without a video
        (dict(video=frames[:3]), "video"),  # too few frames
        (dict(video=frames + frames[:1]), "num_frames"),  # 6 is not 4k + 1
        (dict(video=frames, num_frames=9), "num_frames"),
        (dict(video=[*frames[:4], make_image(16, 16, 0)]), "video"),  # frames differ in size
        (dict(video="/no/such/video.mp4"), "video"),
        (dict(image=frames[0]), "image"),  # a T2V card takes no image
    ]
    for kwargs, field in cases:
        kwargs.setdefault("num_inference_steps", 2)
        with pytest.raises(InvalidRequest) as err:
            gen.generate(PROMPT, height=32, width=32, **kwargs)
        assert err.value.field == field, (kwargs.keys(), err.value)
