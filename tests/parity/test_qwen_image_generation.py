"""Qwen-Image parity: vidloom's native family vs diffusers' QwenImagePipeline, same folder, seed and inputs, on two
tiny random configs (different layers, heads, widths, VAE depth and scheduler)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.adapter_checkpoints import write_tiny_pipeline
from tests.helpers.qwen_image_checkpoints import write_qwen_image_wide
from tests.helpers.reference_pipelines import reference_pipeline
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
# float32 on CPU: the transformer alone is bit-equal to diffusers'; observed image differences are at most a few
# float32 ulps of [0, 1]. A wrong conditioning path moves pixels by > SENSITIVITY (test_conditioning_moves_the_image),
# 25x this bound; the adapter tests' tiny folder has unscaled random weights, so its text moves pixels by ~1e-3 only.
IMAGE_TOLERANCE = 2e-5
SENSITIVITY = 5e-4
EMBED_TOLERANCE = 1e-5
PROMPT = "a cat holding a sign that says hello world"
WRITERS = {"tiny": lambda folder: write_tiny_pipeline(folder, "qwen-image"), "wide": write_qwen_image_wide}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def pair(request, tmp_path_factory):
    from diffusers import QwenImagePipeline

    folder = WRITERS[request.param](tmp_path_factory.mktemp(f"qwen-image-{request.param}"))
    return reference_pipeline(QwenImagePipeline, folder), VideoGenerator.from_pretrained(folder, device="cpu")


def _ours(gen: VideoGenerator, **kw) -> np.ndarray:
    request = GenerationRequest(prompt=kw.get("prompt", PROMPT), task=Task.T2I, height=kw["height"],
                                width=kw["width"], num_inference_steps=kw["steps"], seed=kw["seed"],
                                negative_prompt=kw.get("negative"), guidance_scale=kw.get("scale"))
    return gen.engine.run(request)["video"][0]


def _theirs(pipe, **kw) -> np.ndarray:
    extra = {"negative_prompt": kw["negative"], "true_cfg_scale": kw["scale"]} if kw.get("negative") else {}
    out = pipe(prompt=kw.get("prompt", PROMPT), height=kw["height"], width=kw["width"],
               num_inference_steps=kw["steps"], generator=torch.Generator("cpu").manual_seed(kw["seed"]),
               output_type="np", **extra)
    return np.asarray(out.images)[0]


@pytest.mark.parametrize("negative", [None, "blurry, low quality"], ids=["no-cfg", "true-cfg"])
def test_text_to_image_matches_pipeline(pair, negative):
    pipe, gen = pair
    kw = dict(height=32, width=48, steps=3, seed=11, negative=negative, scale=3.5)  # non-square
    ours, theirs = _ours(gen, **kw), _theirs(pipe, **kw)
    assert ours.shape == theirs.shape == (32, 48, 3)
    assert np.abs(ours - theirs).max() < IMAGE_TOLERANCE, np.abs(ours - theirs).max()


def test_prompt_embedding_matches_pipeline(pair):
    pipe, gen = pair
    ref, mask = pipe.encode_prompt(PROMPT, device=torch.device("cpu"))
    ours = gen.engine.instance["text_encoder"].encode(PROMPT)
    assert mask is None and ours.shape == ref.shape
    assert (ours - ref).abs().max() < EMBED_TOLERANCE


def test_conditioning_moves_the_image(pair):
    # Guards the tolerance above: prompt, negative prompt and CFG scale each move the image by far more than it.
    _, gen = pair
    kw = dict(height=32, width=32, steps=2, seed=5)
    plain = _ours(gen, **kw)
    cfg = _ours(gen, **kw, negative="blurry", scale=4.0)
    assert np.abs(plain - _ours(gen, **kw, prompt="a bowl of fruit")).max() > SENSITIVITY
    assert np.abs(plain - cfg).max() > SENSITIVITY
    assert np.abs(cfg - _ours(gen, **kw, negative="blurry", scale=2.0)).max() > SENSITIVITY


def test_vae_matches_diffusers(pair):
    # AutoencoderKLQwenImage runs on Wan's VAE (vidloom.models.wan): decode and encode equal diffusers'.
    pipe, gen = pair
    vae = gen.engine.instance["vae"]
    z = torch.randn(1, vae.config.z_dim, 1, 4, 6, generator=torch.Generator().manual_seed(0))
    image = torch.rand(1, 3, 1, 32, 48, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        assert (vae.decode(z) - pipe.vae.decode(z).sample).abs().max() < 1e-5
        assert (vae.encode(image).mean - pipe.vae.encode(image).latent_dist.mean).abs().max() < 1e-5
