"""HunyuanVideo-1.5 through the engine (VideoGenerator: card, request defaults, runtime-driven steps, decode) vs the
diffusers pipelines' frames, text and image to video: ours encode and decode with our Hunyuan15VAE loaded from
the folder's `vae/`, the pipelines with diffusers' AutoencoderKLHunyuanVideo15."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.hunyuan15_checkpoints import (
    system_turn_tokens, write_i2v_pipeline, write_pipeline,
)
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import InvalidRequest
from vidloom.generator import VideoGenerator

# uint8 levels: the engine's frames are the float ones rounded; the float frames (CPU) differ by <= 1.5e-6 (T2V
# and I2V, measured), so the rounded ones by 0.500015 at most.
TOLERANCE = 0.51


def _levels(got: np.ndarray, expected: np.ndarray) -> float:
    """The largest difference in uint8 levels between our frames and the pipeline's float ones."""
    diff = float(np.abs(got.astype(np.float32) - expected * 255).max())
    print(f"max difference: {diff:.6f} uint8 levels")
    return diff


def test_text_to_video_frames_match_the_pipeline(tmp_path):
    pipe = write_pipeline(tmp_path, "p1")
    gen = VideoGenerator.from_pretrained(tmp_path, device="cpu", dtype=torch.float32)
    pipe.prompt_template_encode_start_idx = system_turn_tokens(pipe.tokenizer)
    got = gen.generate('a sign that says "open"', height=32, width=48, num_frames=9, num_inference_steps=3,
                       seed=7).frames
    with torch.no_grad():
        expected = pipe(prompt='a sign that says "open"', height=32, width=48, num_frames=9, num_inference_steps=3,
                        generator=torch.Generator().manual_seed(7), output_type="np").frames[0]
    assert got.shape == expected.shape
    assert got.dtype == np.uint8 and _levels(got, expected) < TOLERANCE


def test_vae_tile_decodes_in_tiles_as_the_pipeline(tmp_path):
    # vae_tile 32 every 16 px = diffusers' enable_tiling(32 px tiles, overlap factor 0.5): the 4 x 6 latent is
    # decoded in tiles on both sides, and the seams make the frames differ from the untiled ones.
    pipe = write_pipeline(tmp_path, "p1")
    request = dict(height=32, width=48, num_frames=5, num_inference_steps=2, seed=3)
    plain = VideoGenerator.from_pretrained(tmp_path, device="cpu", dtype=torch.float32).generate("a cat", **request)
    tiled = VideoGenerator.from_pretrained(tmp_path, device="cpu", dtype=torch.float32,
                                           deploy=DeployConfig(vae_tile=32, vae_tile_stride=16))
    got = tiled.generate("a cat", **request).frames
    pipe.prompt_template_encode_start_idx = system_turn_tokens(pipe.tokenizer)
    pipe.vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_latent_min_height=4,
                           tile_latent_min_width=4, tile_overlap_factor=0.5)
    with torch.no_grad():
        expected = pipe(prompt="a cat", height=32, width=48, num_frames=5, num_inference_steps=2,
                        generator=torch.Generator().manual_seed(3), output_type="np").frames[0]
    assert np.abs(got.astype(np.int16) - plain.frames).max() > 0, "vae_tile decoded untiled"
    assert _levels(got, expected) < TOLERANCE


def test_image_to_video_frames_match_the_pipeline(tmp_path):
    pipe = write_i2v_pipeline(tmp_path, "p2")
    gen = VideoGenerator.from_pretrained(tmp_path, device="cpu", dtype=torch.float32)
    pipe.prompt_template_encode_start_idx = system_turn_tokens(pipe.tokenizer)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (80, 45, 3), dtype=np.uint8))
    got = gen.generate("a red fox in the snow", image=image, negative_prompt="blurry", num_frames=5,
                       num_inference_steps=3, seed=9).frames
    with torch.no_grad():
        expected = pipe(image=image, prompt="a red fox in the snow", negative_prompt="blurry", num_frames=5,
                        num_inference_steps=3, generator=torch.Generator().manual_seed(9), output_type="np").frames[0]
    assert got.shape == expected.shape == (5, 80, 48, 3)
    assert got.dtype == np.uint8 and _levels(got, expected) < TOLERANCE
    with pytest.raises(InvalidRequest, match="height"):  # the image's bucket sets the size, as in the pipeline
        gen.generate("a red fox in the snow", image=image, height=64, width=64, num_frames=5)


@pytest.mark.parametrize("policy", ["fbcache", "teacache"])
def test_step_caches_run_the_staged_network(tmp_path, policy):
    # Threshold 0 never reuses (the frames equal the uncached ones); a huge one reuses whenever it may.
    write_pipeline(tmp_path, "p1")
    request = dict(height=32, width=48, num_frames=9, num_inference_steps=4, seed=7)
    plain = VideoGenerator.from_pretrained(tmp_path, device="cpu", dtype=torch.float32).generate("a cat", **request)
    frames = {}
    for threshold in (0.0, 1e9):
        gen = VideoGenerator.from_pretrained(tmp_path, device="cpu", dtype=torch.float32,
                                             deploy=DeployConfig(step_cache=policy, step_cache_threshold=threshold))
        frames[threshold] = gen.generate("a cat", **request).frames
    assert np.array_equal(frames[0.0], plain.frames)
    assert np.abs(frames[1e9].astype(np.int16) - plain.frames).max() > 0, "the cache reused nothing"
