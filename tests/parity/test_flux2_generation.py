"""Flux2 Klein parity: vidloom vs diffusers' Flux2KleinPipeline on the same checkpoint and seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator

# fp32 on CPU: observed max diffs are 1e-6..3e-6 (batched vs separate text encoding); the
# issue's bound is 1e-4. A wrong conditioning path moves pixels by > 1e-2 (see the sensitivity test).
IMAGE_TOLERANCE = 1e-4
# The prompt embedding is the same transformers forward on both sides: bit-close up to batching.
EMBED_TOLERANCE = 1e-5
SENSITIVITY = 5e-3
PROMPT = "a cat holding a sign that says hello world"


@pytest.fixture(scope="module")
def pair(tiny_flux2_dir):
    from diffusers import Flux2KleinPipeline

    pipe = Flux2KleinPipeline.from_pretrained(str(tiny_flux2_dir), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe, VideoGenerator.from_pretrained(tiny_flux2_dir, device="cpu")


def _reference(pipe, **kw) -> np.ndarray:
    out = pipe(prompt=kw.get("prompt", PROMPT), image=kw.get("image"), height=kw.get("height"),
               width=kw.get("width"), num_inference_steps=kw["steps"], guidance_scale=kw["guidance"],
               generator=torch.Generator("cpu").manual_seed(kw["seed"]), output_type="np")
    return out.images[0]  # [H, W, 3] float in [0, 1]


def _ours(gen: VideoGenerator, **kw) -> np.ndarray:
    image = tuple(kw["image"]) if kw.get("image") else None
    request = GenerationRequest(prompt=kw.get("prompt", PROMPT), task=Task.T2I, height=kw.get("height"),
                                width=kw.get("width"), num_inference_steps=kw["steps"],
                                guidance_scale=kw["guidance"], seed=kw["seed"], image=image)
    return gen.engine.run(request)["video"][0]


def _pattern(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(height // 8, width // 8, 3), dtype=np.uint8)
    return Image.fromarray(base).resize((width, height), Image.Resampling.NEAREST)


@pytest.mark.parametrize("guidance", [1.0, 3.5])
def test_text_to_image_matches_pipeline(pair, guidance):
    pipe, gen = pair
    kw = dict(height=32, width=48, steps=3, guidance=guidance, seed=11)  # non-square
    ref, ours = _reference(pipe, **kw), _ours(gen, **kw)
    assert ours.shape == ref.shape == (32, 48, 3)
    assert np.abs(ours - ref).max() < IMAGE_TOLERANCE


@pytest.mark.parametrize("sizes", [[(64, 64)], [(80, 64), (64, 72)]], ids=["one-ref", "two-refs"])
def test_editing_matches_pipeline(pair, sizes):
    pipe, gen = pair
    images = [_pattern(w, h, i) for i, (w, h) in enumerate(sizes)]
    kw = dict(image=images, steps=2, guidance=2.0, seed=3)  # size taken from the first reference
    ref, ours = _reference(pipe, **kw), _ours(gen, **kw)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() < IMAGE_TOLERANCE


def test_prompt_embedding_matches_pipeline(pair):
    pipe, gen = pair
    ref = pipe._get_qwen3_prompt_embeds(pipe.text_encoder, pipe.tokenizer, [PROMPT], dtype=torch.float32)
    ours = gen.engine.instance["text_encoder"].encode([PROMPT])
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max() < EMBED_TOLERANCE


def test_conditioning_moves_the_image(pair):
    # Guards the tolerance above: prompt and reference image each move the image by > 50x the
    # tolerance (> 1 uint8 level; the random VAE decoder compresses latent differences a lot).
    _, gen = pair
    kw = dict(height=64, width=64, steps=2, guidance=1.0, seed=5)
    plain = _ours(gen, **kw)
    assert np.abs(plain - _ours(gen, **kw, prompt="a bowl of fruit")).max() > SENSITIVITY
    assert np.abs(plain - _ours(gen, **kw, image=[_pattern(64, 64, 9)])).max() > SENSITIVITY


def test_negative_prompt_drives_cfg_on_the_base_model(pair):
    pipe, gen = pair
    if pipe.config.is_distilled:
        pytest.skip("step-distilled Klein runs no CFG, so no negative branch")
    kw = dict(height=32, width=48, steps=2, guidance=4.0, seed=1)
    plain = _ours(gen, **kw)  # negative "" (the card default): what the pipeline computes
    assert np.abs(plain - _reference(pipe, **kw)).max() < IMAGE_TOLERANCE
    request = GenerationRequest(prompt=PROMPT, task=Task.T2I, negative_prompt="a bowl of fruit", height=32,
                                width=48, num_inference_steps=2, guidance_scale=4.0, seed=1)
    assert np.abs(gen.engine.run(request)["video"][0] - plain).max() > SENSITIVITY
