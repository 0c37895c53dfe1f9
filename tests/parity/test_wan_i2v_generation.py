"""End-to-end parity: Wan2.1 I2V and first-last-frame vs diffusers' WanImageToVideoPipeline."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.wan_checkpoints import TINY_A, TINY_B
from tests.helpers.wan_i2v_checkpoints import make_image, write_tiny_wan_i2v
from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.parity import ParityRun, run_parity

TOLERANCE = 1e-4  # as the T2V parity tests (fp32 CPU; observed diffs ~1e-6)
PROMPT = "a red fox jumps over a frozen river"
NEGATIVE = "blurred, low quality"


@pytest.fixture(scope="module", params=[(TINY_A, False), (TINY_B, False), (TINY_A, True)],
                ids=["tiny-a", "tiny-b", "tiny-a-first-last"])
def i2v_dir(request, tmp_path_factory):
    spec, first_last = request.param
    folder = tmp_path_factory.mktemp(f"i2v-{spec.name}-{first_last}")
    return write_tiny_wan_i2v(folder, spec, first_last=first_last), first_last


def _request(image, last_image, **kw) -> GenerationRequest:
    return GenerationRequest(
        prompt=PROMPT, negative_prompt=NEGATIVE, image=image, last_image=last_image, height=kw["height"],
        width=kw["width"], num_frames=kw["num_frames"], num_inference_steps=kw["steps"],
        guidance_scale=kw["guidance"], flow_shift=3.0, seed=kw["seed"],
    )


def _ours(gen: VideoGenerator, image, last_image, **kw) -> np.ndarray:
    return gen.engine.run(_request(image, last_image, **kw))["video"]  # float frames in [0, 1], as diffusers' np


def _compare(folder, gen: VideoGenerator, image, last_image, **kw) -> ParityRun:
    """Both sides through the parity tool (WanImageToVideoPipeline's map: block and latents taps; the CLIP
    tokens reach every block), so a failure names the first diverging step, call and block."""
    return run_parity(folder, _request(image, last_image, **kw), generator=gen)


CASES = {
    # the image's size differs from the request: both sides resize it (Lanczos) the same way
    "nonsquare": dict(height=32, width=48, num_frames=9, steps=3, guidance=5.0, seed=42, image_size=(60, 41)),
    "tall-nocfg": dict(height=48, width=16, num_frames=5, steps=3, guidance=1.0, seed=7, image_size=(16, 48)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_i2v_matches_diffusers(i2v_dir, case):
    folder, first_last = i2v_dir
    kw = CASES[case]
    image = make_image(*kw["image_size"], seed=1)
    last = make_image(*kw["image_size"], seed=2) if first_last else None
    gen = VideoGenerator.from_pretrained(folder, device="cpu")
    result = _compare(folder, gen, image, last, **kw)
    expected, got, report = result.theirs, result.ours, result.report.format()
    assert got.shape == expected.shape == (kw["num_frames"], kw["height"], kw["width"], 3), report
    diff = float(np.abs(got - expected).max())
    assert diff <= TOLERANCE, f"{case}: max abs diff {diff:.3e}\n{report}"
    assert result.report.ok, report
    assert {d.key.kind for d in result.report.diffs} == {"block", "latents", "stage"}, report
    # The image must steer the video, or parity would hold with the conditioning dropped.
    other = _ours(gen, make_image(*kw["image_size"], seed=9), last, **kw)
    assert float(np.abs(other - got).max()) > 20 / 255


def test_i2v_card_refuses_text_only_and_video(i2v_dir):
    folder, first_last = i2v_dir
    gen = VideoGenerator.from_pretrained(folder, device="cpu")
    assert gen.card.tasks == {"i2v"}
    with pytest.raises(InvalidRequest) as err:
        gen.generate(PROMPT, height=32, width=32, num_frames=5, num_inference_steps=1)
    assert err.value.field == "image"
    with pytest.raises(InvalidRequest) as err:
        gen.generate(PROMPT, video=[make_image(32, 32, 0)] * 5, num_inference_steps=1)
    assert err.value.field == "video"
    if first_last:
        with pytest.raises(InvalidRequest) as err:
            gen.generate(PROMPT, image=make_image(32, 32, 0), height=32, width=32, num_frames=5)
        assert err.value.field == "last_image"

