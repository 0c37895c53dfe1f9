"""End-to-end parity: a Wan2.2-I2V-A14B-style folder (two I2V experts, no CLIP, boundary_ratio 0.9) vs diffusers'
WanImageToVideoPipeline, with a schedule step exactly on the boundary."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers.wan22_checkpoints import write_tiny_a14b_i2v
from tests.helpers.wan_checkpoints import TINY_A, TINY_B
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.sampler import make_sampler
from vidloom.generator import VideoGenerator

TOLERANCE = 1e-4  # as the other Wan parity tests (fp32 CPU)
PROMPT = "a red fox jumps over a frozen river"
NEGATIVE = "blurred, low quality"
SHIFT = 3.0  # 4 UniPC steps at shift 3 give timesteps 999, 900, 750, 500: the second is exactly 0.9 x 1000
CASE = dict(height=32, width=48, num_frames=9, steps=4, guidance=5.0, guidance_2=2.0, seed=11)


@pytest.fixture(scope="module", params=[TINY_A, TINY_B], ids=lambda s: s.name)
def a14b_i2v_dir(request, tmp_path_factory):
    return write_tiny_a14b_i2v(tmp_path_factory.mktemp(f"a14b-i2v-{request.param.name}"), request.param)


def _reference(folder, image) -> np.ndarray:
    from diffusers import WanImageToVideoPipeline

    pipe = WanImageToVideoPipeline.from_pretrained(str(folder), dtype=torch.float32)
    pipe.scheduler = pipe.scheduler.__class__.from_config(pipe.scheduler.config, flow_shift=SHIFT)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        image=image, prompt=PROMPT, negative_prompt=NEGATIVE, height=CASE["height"], width=CASE["width"],
        num_frames=CASE["num_frames"], num_inference_steps=CASE["steps"], guidance_scale=CASE["guidance"],
        guidance_scale_2=CASE["guidance_2"], generator=torch.Generator("cpu").manual_seed(CASE["seed"]),
        output_type="np",
    )
    return out.frames[0]


def _ours(gen: VideoGenerator, image, guidance_2: float) -> np.ndarray:
    request = GenerationRequest(
        prompt=PROMPT, negative_prompt=NEGATIVE, image=image, height=CASE["height"], width=CASE["width"],
        num_frames=CASE["num_frames"], num_inference_steps=CASE["steps"], guidance_scale=CASE["guidance"],
        guidance_scale_2=guidance_2, flow_shift=SHIFT, seed=CASE["seed"],
    )
    return gen.engine.run(request)["video"]


def test_published_layout_is_what_we_load(a14b_i2v_dir):
    index = json.loads((a14b_i2v_dir / "model_index.json").read_text())
    assert index["_class_name"] == "WanImageToVideoPipeline" and index["boundary_ratio"] == 0.9
    assert index["image_encoder"] == [None, None] and index["expand_timesteps"] is False
    gen = VideoGenerator.from_pretrained(a14b_i2v_dir, device="cpu")
    assert gen.card.tasks == {"i2v"} and "guidance_scale_2" in gen.card.option_names and "image_encoder" not in gen.engine.instance.components


def test_two_i2v_experts_match_diffusers_with_a_step_on_the_boundary(a14b_i2v_dir):
    gen = VideoGenerator.from_pretrained(a14b_i2v_dir, device="cpu")
    loop = next(node.loop for node in gen.engine.program.nodes if node.loop is not None)
    timesteps = make_sampler("unipc", loop.sampler_config.with_shift(SHIFT)).schedule(CASE["steps"]).timesteps
    assert timesteps.tolist() == [999, 900, 750, 500]
    # diffusers: `t >= boundary_ratio * num_train_timesteps` runs the high-noise expert, so 900 does.
    assert [loop.expert_for(t) for t in timesteps] == ["transformer"] * 2 + ["transformer_2"] * 2
    image = make_image(60, 41, seed=1)
    expected = _reference(a14b_i2v_dir, image)
    got = _ours(gen, image, CASE["guidance_2"])
    assert got.shape == expected.shape == (CASE["num_frames"], CASE["height"], CASE["width"], 3)
    diff = float(np.abs(got - expected).max())
    assert diff <= TOLERANCE, f"max abs diff {diff:.3e}"
    assert expected.std() > 1e-3
    # The low-noise expert's own scale is used, and the image steers the video.
    assert float(np.abs(_ours(gen, image, CASE["guidance"]) - got).max()) > 1e-3
    assert float(np.abs(_ours(gen, make_image(60, 41, seed=9), CASE["guidance_2"]) - got).max()) > 1e-3
