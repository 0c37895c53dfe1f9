"""Cross-request batching of Qwen-Image steps (#35): requests of one image size and one reference layout share a
forward whatever their prompts' lengths, seeds, step counts and guidance scales; the shorter prompts are zero-padded
and masked out of the joint attention (QwenImageText.stack, the path batched CFG runs for one request's two prompts).
A text-to-image request and an edit, or a guided and an unguided request, run in separate forwards.

Batched and single forwards differ by matmul blocking over the batch and by the masked attention's summation order
(float32 demo checkpoint): within 1e-5 of a step output's magnitude, as for the other families (test_batching.py);
the decoded images within one uint8 level.
"""

from __future__ import annotations

import pytest

from tests.helpers.batched_runs import assert_batched_equals_single, assert_served_like_alone, first_plans
from tests.helpers.qwen_image_checkpoints import write_qwen_image_edit
from tests.parity.test_qwen_image_edit import _pattern
from vidloom.core.deploy import DeployConfig
from vidloom.generator import VideoGenerator, build_request
from vidloom.runtime.batching import batch_key

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
RTOL = 1e-5
UINT8_TOLERANCE = 1
SHAPE = dict(height=32, width=48)
# Prompts (and negative prompts) of different token counts: no two requests' texts have one length.
KINDS = (dict(prompt="a red fox", negative_prompt="blurry, low quality, dark", seed=1, guidance_scale=4.0,
              num_inference_steps=2),
         dict(prompt="an astronaut riding a horse on the moon, photorealistic", negative_prompt="dark", seed=2,
              guidance_scale=2.5, num_inference_steps=3))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("qwen-image-batch")


@pytest.fixture(scope="module")
def engine(cache):
    return VideoGenerator.from_pretrained("qwen-image-demo", device="cpu", cache_dir=cache).engine


@pytest.fixture(scope="module")
def batched_cfg(cache, engine):
    return VideoGenerator.from_pretrained("qwen-image-demo", device="cpu", cache_dir=cache,
                                          deploy=DeployConfig(cfg_mode="batched")).engine


def _requests(engine, images=(None, None), **override):
    return [build_request(engine.instance.card, **{**SHAPE, **kind, **override,
                                                   **({"image": [image]} if image is not None else {})})
            for kind, image in zip(KINDS, images)]


def _texts(plans):
    return [plan.inputs["prompt_embeds"].embeds.shape[1] for plan in plans]


@pytest.mark.parametrize("cfg_mode", ["sequential", "batched"])
@pytest.mark.parametrize("guidance", [None, 1.0], ids=["cfg", "no-cfg"])
def test_a_batched_step_equals_the_single_steps(engine, batched_cfg, cfg_mode, guidance):
    engine = batched_cfg if cfg_mode == "batched" else engine
    override = {} if guidance is None else {"guidance_scale": guidance}
    with first_plans(engine, _requests(engine, **override)) as plans:
        assert len(set(_texts(plans))) == 2  # the prompts' lengths differ
        assert batch_key(plans[0]) is not None and batch_key(plans[0]) == batch_key(plans[1])
        assert_batched_equals_single(plans, RTOL)


def test_edits_with_one_reference_layout_share_a_step(engine):
    images = (_pattern(64, 48, 1), _pattern(96, 72, 2))  # one aspect: one reference grid
    with first_plans(engine, _requests(engine, images)) as plans:
        assert len(set(_texts(plans))) == 2
        assert batch_key(plans[0]) is not None and batch_key(plans[0]) == batch_key(plans[1])
        assert_batched_equals_single(plans, RTOL)


def test_zero_cond_t_edits_share_a_step(cache):
    """Qwen-Image-Edit-2511: which image rows take timestep 0 follows from the grids, which the batch key holds."""
    folder = write_qwen_image_edit(cache / "edit-2511", pipeline="QwenImageEditPlusPipeline", zero_cond_t=True)
    engine = VideoGenerator.from_pretrained(folder, device="cpu").engine
    assert engine.instance["transformer"].config.zero_cond_t
    images = (_pattern(64, 48, 1), _pattern(96, 72, 2))
    with first_plans(engine, _requests(engine, images)) as plans:
        assert batch_key(plans[0]) is not None and batch_key(plans[0]) == batch_key(plans[1])
        assert_batched_equals_single(plans, RTOL)


def test_layouts_and_guidance_that_differ_do_not_share_a_forward(engine):
    t2i, edit = _requests(engine)[0], _requests(engine, (None, _pattern(64, 48, 1)))[1]
    other_aspect = _requests(engine, (_pattern(64, 48, 1), _pattern(48, 64, 2)))
    guided, unguided = _requests(engine)[0], _requests(engine, guidance_scale=1.0)[1]
    for pair in ([t2i, edit], other_aspect, [guided, unguided]):
        with first_plans(engine, pair) as plans:
            assert batch_key(plans[0]) != batch_key(plans[1])


@pytest.mark.parametrize("cfg_mode", ["sequential", "batched"])
def test_concurrent_requests_equal_their_single_runs(engine, batched_cfg, cfg_mode):
    engine = batched_cfg if cfg_mode == "batched" else engine
    assert_served_like_alone(engine, _requests(engine), UINT8_TOLERANCE)
