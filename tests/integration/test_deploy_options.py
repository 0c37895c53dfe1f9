"""DeployConfig options on the demo model: each against the plain path with a stated bound."""

from __future__ import annotations

import numpy as np
import pytest

from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.layers.fp8 import FP8Linear

REQUEST = dict(prompt="a red fox jumps", height=32, width=48, num_frames=5, num_inference_steps=3, seed=4)


def _video(demo_cache, deploy: DeployConfig, **changes) -> np.ndarray:
    gen = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache, deploy=deploy)
    return gen.engine.run(GenerationRequest(**{**REQUEST, **changes}))["video"]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


@pytest.fixture(scope="module")
def plain(demo_cache) -> np.ndarray:
    return _video(demo_cache, DeployConfig())


def test_fp8_weights_stay_close_to_fp32(demo_cache, plain):
    gen = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache,
                                         deploy=DeployConfig(fp8_weights=True))
    transformer = gen.engine.instance["transformer"]
    assert isinstance(transformer.blocks[0].ffn.up, FP8Linear)
    assert not isinstance(transformer.proj_out, FP8Linear)
    video = gen.engine.run(GenerationRequest(**REQUEST))["video"]
    # e4m3 weights (3 mantissa bits) through 3 steps of the demo DiT: measured 66 dB.
    assert psnr(video, plain) > 30


def test_vae_tiling_is_close_to_whole_frame_decode(demo_cache, plain):
    # Exactness of the tiling itself is tested against diffusers' tiled decode
    # (tests/parity/test_wan_vae_tiling.py). Here: 32-pixel tiles every 16 pixels on a
    # 32x48 frame lose context at the seams of a random-weight VAE; measured 23.4 dB.
    tiled = _video(demo_cache, DeployConfig(vae_tile=32, vae_tile_stride=16))
    assert tiled.shape == plain.shape and psnr(tiled, plain) > 20
    one_tile = _video(demo_cache, DeployConfig(vae_tile=64))
    assert np.array_equal(one_tile, plain)


def test_bad_vae_tile_fails_at_load(demo_cache):
    with pytest.raises(ValueError, match="multiples of 8"):
        _video(demo_cache, DeployConfig(vae_tile=20))


def test_prompt_cache_gives_identical_video(demo_cache, plain):
    gen = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache,
                                         deploy=DeployConfig(prompt_cache_size=8))
    first = gen.engine.run(GenerationRequest(**REQUEST))["video"]
    second = gen.engine.run(GenerationRequest(**REQUEST))["video"]
    assert np.array_equal(first, plain) and np.array_equal(second, plain)
    assert gen.engine.instance["text_encoder"].cache.hits == 2  # prompt + negative prompt


def test_compile_matches_eager_and_does_not_recompile_for_new_prompt_or_seed(demo_cache, plain):
    import torch._dynamo

    torch._dynamo.reset()
    shape = (REQUEST["height"], REQUEST["width"], REQUEST["num_frames"])
    gen = VideoGenerator.from_pretrained(
        "wan2.1-demo", device="cpu", cache_dir=demo_cache,
        deploy=DeployConfig(compile=True, compile_backend="aot_eager", warmup_shapes=(shape,)),
    )
    with torch._dynamo.config.patch(error_on_recompile=True):
        video = gen.engine.run(GenerationRequest(**REQUEST))["video"]
        gen.engine.run(GenerationRequest(**{**REQUEST, "prompt": "a different prompt", "seed": 99}))
    # aot_eager runs the same aten ops as eager: observed 0 difference; allow fp32 noise.
    assert np.abs(video - plain).max() <= 1e-5
    torch._dynamo.reset()


def test_compile_runs_a_shape_outside_its_buckets_eagerly_without_recompiling(demo_cache):
    import torch._dynamo

    torch._dynamo.reset()
    shape = (REQUEST["height"], REQUEST["width"], REQUEST["num_frames"])
    gen = VideoGenerator.from_pretrained(
        "wan2.1-demo", device="cpu", cache_dir=demo_cache,
        deploy=DeployConfig(compile=True, compile_backend="aot_eager", warmup_shapes=(shape,)),
    )
    outside = {**REQUEST, "height": 48}
    with torch._dynamo.config.patch(error_on_recompile=True):  # a recompile would raise here
        video = gen.engine.run(GenerationRequest(**outside))["video"]
    assert gen.engine.compile_misses == 1
    assert np.abs(video - _video(demo_cache, DeployConfig(), height=48)).max() <= 1e-5
    torch._dynamo.reset()
