"""Cross-request batching of HunyuanVideo-1.5 steps (#35): requests of one video size share a forward whatever their
prompts' lengths (and glyph texts), seeds, step counts and guidance scales; the shorter condition tokens are padded
and masked by the transformer's own per-sample key mask (stack_prompts). A step that runs CFG and one that does not
run apart.

Batched and single forwards differ by matmul blocking over the batch and the masked attention's summation order
(float32 tiny checkpoint): within 1e-5 of a step output's magnitude, as for the other families (test_batching.py);
the decoded frames within one uint8 level.
"""

from __future__ import annotations

import pytest

from tests.helpers.batched_runs import assert_batched_equals_single, assert_served_like_alone, first_plans
from tests.helpers.hunyuan15_checkpoints import write_i2v_pipeline, write_pipeline
from tests.parity.test_hunyuan15_i2v import _image
from vidloom.generator import VideoGenerator, build_request
from vidloom.runtime.batching import batch_key

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
RTOL = 1e-5
UINT8_TOLERANCE = 1
SHAPE = dict(height=32, width=48, num_frames=5)
# Prompts of different token counts, one with quoted text (glyph tokens) and one without.
KINDS = (dict(prompt='a sign that says "open"', negative_prompt="blurry", seed=1, guidance_scale=5.0,
              num_inference_steps=2),
         dict(prompt="a red fox runs through deep snow at dusk", negative_prompt="dark, low quality", seed=2,
              guidance_scale=3.0, num_inference_steps=3))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hunyuan15-batch") / "p1"
    write_pipeline(folder, "p1")
    return VideoGenerator.from_pretrained(folder, device="cpu").engine


def _requests(engine, **override):
    return [build_request(engine.instance.card, **{**SHAPE, **kind, **override}) for kind in KINDS]


@pytest.mark.parametrize("guidance", [None, 1.0], ids=["cfg", "no-cfg"])
def test_a_batched_step_equals_the_single_steps(engine, guidance):
    override = {} if guidance is None else {"guidance_scale": guidance}
    with first_plans(engine, _requests(engine, **override)) as plans:
        lengths = {plan.inputs["prompt"].rows[0].text.shape[0] for plan in plans}
        assert len(lengths) == 2  # the prompts' lengths differ
        assert batch_key(plans[0]) is not None and batch_key(plans[0]) == batch_key(plans[1])
        assert_batched_equals_single(plans, RTOL)


@pytest.mark.parametrize("name", ["p1", "p2"], ids=["i2v", "i2v-meanflow"])
def test_image_to_video_steps_share_a_forward(tmp_path, name):
    """Each row reads its own first frame's condition latents and image tokens (meanflow: one target t per step)."""
    write_i2v_pipeline(tmp_path, name)
    engine = VideoGenerator.from_pretrained(tmp_path, device="cpu").engine
    images = [_image((50, 30)), _image((50, 30)).transpose(0)]  # one aspect bucket, different pixels
    requests = [build_request(engine.instance.card, **{**kind, "num_frames": 5, "num_inference_steps": 3,
                                                       "image": [image]}) for kind, image in zip(KINDS, images)]
    with first_plans(engine, requests) as plans:
        assert batch_key(plans[0]) is not None and batch_key(plans[0]) == batch_key(plans[1])
        assert_batched_equals_single(plans, RTOL)


def test_sizes_and_guidance_that_differ_do_not_share_a_forward(engine):
    other_size = [_requests(engine)[0], _requests(engine, height=48, width=32)[1]]
    guided_unguided = [_requests(engine)[0], _requests(engine, guidance_scale=1.0)[1]]
    for pair in (other_size, guided_unguided):
        with first_plans(engine, pair) as plans:
            assert batch_key(plans[0]) != batch_key(plans[1])


def test_concurrent_requests_equal_their_single_runs(engine):
    assert_served_like_alone(engine, _requests(engine), UINT8_TOLERANCE)
