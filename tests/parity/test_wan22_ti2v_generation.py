"""End-to-end parity: Wan2.2 TI2V (one checkpoint, text- and image-to-video, per-token timesteps)
vs diffusers' WanPipeline(expand_timesteps=True) and WanImageToVideoPipeline(expand_timesteps=True)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.reference_pipelines import reference_pipeline
from tests.helpers.wan22_checkpoints import TINY_TI2V, TINY_TI2V_B, write_tiny_ti2v
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.parity import ParityRun, Reference, run_parity
from vidloom.families.wan.parity import WAN_I2V, WAN_T2V

TOLERANCE = 1e-4  # as the Wan2.1 parity tests (fp32 CPU)
PROMPT = "a red fox jumps over a frozen river"
NEGATIVE = "blurred, low quality"
CASES = {
    "nonsquare": dict(height=32, width=64, num_frames=9, steps=3, guidance=5.0, seed=42),
    "tall-nocfg": dict(height=64, width=32, num_frames=5, steps=3, guidance=1.0, seed=7),
}


@pytest.fixture(scope="module", params=[TINY_TI2V, TINY_TI2V_B], ids=lambda s: s.name)
def ti2v_dir(request, tmp_path_factory):
    return write_tiny_ti2v(tmp_path_factory.mktemp(request.param.name), request.param)


def _reference(folder, image) -> Reference:
    """The folder's WanPipeline; with an image, WanImageToVideoPipeline(expand_timesteps=True) over its parts."""
    from diffusers import WanImageToVideoPipeline, WanPipeline

    pipe = reference_pipeline(WanPipeline, folder)
    if image is None:
        return Reference.wrap(pipe, WAN_T2V)
    pipe = WanImageToVideoPipeline(
        tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae, scheduler=pipe.scheduler,
        transformer=pipe.transformer, image_encoder=None, image_processor=None, expand_timesteps=True,
    )
    pipe.set_progress_bar_config(disable=True)
    return Reference.wrap(pipe, WAN_I2V)


def _request(image, **kw) -> GenerationRequest:
    return GenerationRequest(
        prompt=PROMPT, negative_prompt=NEGATIVE, image=image, height=kw["height"], width=kw["width"],
        num_frames=kw["num_frames"], num_inference_steps=kw["steps"], guidance_scale=kw["guidance"],
        flow_shift=5.0, seed=kw["seed"],
    )


def _ours(gen, image, **kw) -> np.ndarray:
    return gen.engine.run(_request(image, **kw))["video"]


def _compare(folder, gen, image, **kw) -> ParityRun:
    """Both sides through the parity tool: a failure names the first diverging step, call and block."""
    return run_parity(folder, _request(image, **kw), generator=gen, reference=_reference(folder, image))


@pytest.mark.parametrize("with_image", [False, True], ids=["t2v", "i2v"])
@pytest.mark.parametrize("case", list(CASES))
def test_ti2v_matches_diffusers(ti2v_dir, case, with_image):
    kw = CASES[case]
    image = make_image(kw["width"] + 10, kw["height"] - 6, seed=1) if with_image else None
    gen = VideoGenerator.from_pretrained(ti2v_dir, device="cpu")
    assert gen.card.tasks == {"t2v", "i2v"} and gen.card.family == "wan2.2"
    result = _compare(ti2v_dir, gen, image, **kw)
    expected, got, report = result.theirs, result.ours, result.report.format()
    assert got.shape == expected.shape == (kw["num_frames"], kw["height"], kw["width"], 3), report
    diff = float(np.abs(got - expected).max())
    assert diff <= TOLERANCE, f"{case}: max abs diff {diff:.3e}\n{report}"
    assert expected.std() > 1e-3
    assert result.report.ok, report
    if with_image:  # the image must steer the video
        other = _ours(gen, make_image(kw["width"], kw["height"], seed=5), **kw)
        assert float(np.abs(other - got).max()) > 20 / 255
