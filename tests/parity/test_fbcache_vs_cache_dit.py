"""First-block cache vs cache-dit's DBCache with one front block and none behind (F1B0), the same method."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.parity.test_wan_generation import NEGATIVE, PROMPT
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from tests.helpers.reference_pipelines import reference_pipeline

cache_dit = pytest.importorskip("cache_dit")

KW = dict(height=32, width=48, num_frames=9, num_inference_steps=8, guidance_scale=5.0)
SEED = 3
# Same decisions, then the generation's own fp32 noise: observed 3.0e-6..3.9e-6.
TOLERANCE = 1e-4


def _cache_dit(folder, threshold: float) -> tuple[np.ndarray, int]:
    from diffusers import WanPipeline

    pipe = reference_pipeline(WanPipeline, folder)
    # max_warmup_steps=1: only step 1 is forced to compute, as in ours (nothing to reuse yet).
    config = cache_dit.DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0,
                                     residual_diff_threshold=threshold, max_warmup_steps=1)
    cache_dit.enable_cache(pipe, cache_config=config)
    frames = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, **KW, output_type="np",
                  generator=torch.Generator("cpu").manual_seed(SEED)).frames[0]
    stats = cache_dit.summary(pipe, logging=False)
    cached = stats[0].cached_steps
    assert stats[0].cfg_cached_steps == cached  # both branches decided alike, as ours must for a skip
    return frames, len(cached)


@pytest.mark.parametrize("threshold", [0.15, 0.3])
def test_fbcache_matches_cache_dit_f1b0(tiny_wan_dir, threshold):
    expected, cached_steps = _cache_dit(tiny_wan_dir, threshold)
    gen = VideoGenerator.from_pretrained(tiny_wan_dir, device="cpu",
                                         deploy=DeployConfig(step_cache="fbcache", step_cache_threshold=threshold))
    out = gen.run(GenerationRequest(prompt=PROMPT, negative_prompt=NEGATIVE, **KW, seed=SEED, sampler="unipc"))
    assert out.metadata["step_cache"]["skipped_steps"] == cached_steps > 0
    got = gen.engine.run(GenerationRequest(prompt=PROMPT, negative_prompt=NEGATIVE, **KW, seed=SEED))["video"]
    diff = float(np.abs(got - expected).max())
    assert diff <= TOLERANCE, f"threshold {threshold}: max abs diff {diff:.3e}"
