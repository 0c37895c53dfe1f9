"""Qwen-Image multi-image editing parity: vidloom's native family vs diffusers' QwenImageEditPlusPipeline on a tiny
random folder: each reference "Picture N" in the VL prompt (at ~384^2) and as latent tokens at rotary frame N
(at ~1024^2); and the same folder as Qwen-Image-Edit-2511 (`zero_cond_t`: the references' tokens modulated at
timestep 0)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.qwen_image_checkpoints import edit_processor, write_qwen_image_edit
from tests.helpers.reference_pipelines import reference_pipeline
from tests.parity.test_qwen_image_edit import _pattern
from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
# float32 on CPU, as test_qwen_image_edit: the same transformer, VAE and VL encoder, PIL's Lanczos on both sides.
IMAGE_TOLERANCE = 2e-5
PROMPT = "put the cat from picture 1 on the sofa of picture 2"


def _pair(tmp_path_factory, zero_cond_t: bool = False):
    """(diffusers' pipeline, our generator) over one tiny folder; equal weights whatever `zero_cond_t`."""
    from diffusers import QwenImageEditPlusPipeline

    folder = write_qwen_image_edit(tmp_path_factory.mktemp("qwen-image-edit-plus"), seed=5,
                                   pipeline="QwenImageEditPlusPipeline", zero_cond_t=zero_cond_t)
    pipe = reference_pipeline(QwenImageEditPlusPipeline, folder, processor=edit_processor(folder))
    return pipe, VideoGenerator.from_pretrained(folder, device="cpu")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return _pair(tmp_path_factory)


def _ours(gen: VideoGenerator, images: tuple, height: int, width: int, negative: str | None) -> np.ndarray:
    request = GenerationRequest(prompt=PROMPT, task=Task.T2I, height=height, width=width, seed=4,
                                num_inference_steps=2, image=images, negative_prompt=negative, guidance_scale=3.0)
    return gen.engine.run(request)["video"][0]


# One 3:2 reference into a 32x48 output without CFG; a 2:3 and a 1:1 reference into 64x32 with true CFG.
CASES = {"one-image": ([(96, 64, 1)], 32, 48, None), "two-images": ([(64, 96, 2), (80, 80, 3)], 64, 32, "blurry")}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_edit_plus_matches_pipeline(pair, case):
    _assert_matches(pair, *CASES[case])


def _assert_matches(pair, sizes, height: int, width: int, negative: str | None) -> None:
    pipe, gen = pair
    images = tuple(_pattern(w, h, seed) for w, h, seed in sizes)
    extra = {"negative_prompt": negative, "true_cfg_scale": 3.0} if negative else {}
    theirs = pipe(image=list(images), prompt=PROMPT, height=height, width=width, num_inference_steps=2,
                  generator=torch.Generator("cpu").manual_seed(4), output_type="np", **extra).images[0]
    ours = _ours(gen, images, height, width, negative)
    assert ours.shape == theirs.shape == (height, width, 3)
    assert np.abs(ours - theirs).max() < IMAGE_TOLERANCE, np.abs(ours - theirs).max()


def test_the_second_picture_moves_the_edit(pair):
    _, gen = pair
    first = _pattern(64, 96, 2)
    one = _ours(gen, (first, _pattern(80, 80, 3)), 64, 32, None)
    other = _ours(gen, (first, _pattern(80, 80, 4)), 64, 32, None)
    assert np.abs(one - other).max() > 10 * IMAGE_TOLERANCE


def test_more_pictures_than_the_card_takes_are_refused(pair):
    _, gen = pair
    images = tuple(_pattern(32, 32, seed) for seed in range(gen.card.max_reference_images + 1))
    with pytest.raises(InvalidRequest, match="more than the limit of 3"):
        gen.generate(prompt=PROMPT, image=images, height=32, width=32, num_inference_steps=1)


# Qwen-Image-Edit-2511: the same weights under `zero_cond_t`, the references' tokens modulated at timestep 0.
@pytest.fixture(scope="module")
def pair_2511(tmp_path_factory):
    return _pair(tmp_path_factory, zero_cond_t=True)


CASES_2511 = {f"{case}-{cfg}": (*CASES[case][:3], negative)
              for case in CASES for cfg, negative in (("cfg", "blurry"), ("no-cfg", None))}


@pytest.mark.parametrize("case", CASES_2511, ids=list(CASES_2511))
def test_zero_cond_t_edit_plus_matches_pipeline(pair_2511, case):
    _assert_matches(pair_2511, *CASES_2511[case])


def test_zero_cond_t_moves_the_edit(pair, pair_2511):
    """Equal weights: only the references' modulation differs."""
    images = (_pattern(64, 96, 2), _pattern(80, 80, 3))
    assert np.abs(_ours(pair[1], images, 64, 32, None) - _ours(pair_2511[1], images, 64, 32, None)).max() > 1e-3


def test_zero_cond_t_transformer_matches_diffusers(pair_2511):
    """The transformer alone, two samples at their own timesteps over a target and two reference grids."""
    from diffusers import QwenImageTransformer2DModel

    _, gen = pair_2511
    theirs = QwenImageTransformer2DModel.from_pretrained(str(gen.engine.instance.checkpoint_dir) + "/transformer")
    ours = gen.engine.instance["transformer"]
    grids = ((2, 3), (3, 2), (2, 2))
    g = torch.Generator().manual_seed(0)
    img = torch.randn(2, sum(h * w for h, w in grids), 16, generator=g)
    txt = torch.randn(2, 5, 16, generator=g)
    t = torch.tensor([0.9, 0.3])
    with torch.inference_mode():
        expected = theirs(img, txt, torch.ones(2, 5), t, img_shapes=[[(1, h, w) for h, w in grids]] * 2,
                          return_dict=False)[0]
        got = ours(img, txt, t, grids)
    # Observed ~2e-7 (one ulp of fused roundings); ignoring zero_cond_t moves the output by ~7e-2.
    assert (got - expected).abs().max().item() < 1e-5, (got - expected).abs().max().item()
