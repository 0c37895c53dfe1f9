"""DBCache (Fn/Bn, step limits, TaylorSeer order 1 and 2) vs cache-dit's on a tiny Wan: same decisions, same frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.reference_pipelines import reference_pipeline
from tests.helpers.wan_checkpoints import TinyWan, wan_dit, wan_vae, write_tiny_wan
from tests.parity.test_wan_generation import NEGATIVE, PROMPT
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime import request_run

cache_dit = pytest.importorskip("cache_dit")

# Four blocks, so F2B1 leaves a middle block to cache.
TINY_4 = TinyWan(name="tiny-4", transformer=wan_dit(heads=2, head_dim=12, channels=4, ffn_dim=32, layers=4, freq_dim=16),
                 vae=wan_vae(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1))
KW = dict(height=32, width=48, num_frames=9, num_inference_steps=10, guidance_scale=5.0)
SEED = 3
# Same decisions, then the generation's own float32 noise (as the fbcache parity test): observed 2.6e-6..3.0e-6.
TOLERANCE = 1e-4

# (Fn, Bn, threshold, TaylorSeer order, max continuous cached steps): chosen so that each case caches some
# steps and computes others after step 3, where TaylorSeer's derivatives start (cache-dit's bookkeeping).
CASES = {
    "F2B1": (2, 1, 0.2, 0, -1),
    "F1B1-taylor1-max2": (1, 1, 0.2, 1, 2),
    "F2B1-taylor2-max2": (2, 1, 0.3, 2, 2),
}


@pytest.fixture(scope="module")
def tiny4_dir(tmp_path_factory) -> Path:
    return write_tiny_wan(tmp_path_factory.mktemp("tiny-4"), TINY_4)


def _cache_dit(folder: Path, fn: int, bn: int, threshold: float, order: int, streak: int):
    from diffusers import WanPipeline

    pipe = reference_pipeline(WanPipeline, folder)
    config = cache_dit.DBCacheConfig(Fn_compute_blocks=fn, Bn_compute_blocks=bn, residual_diff_threshold=threshold,
                                     max_warmup_steps=1, max_continuous_cached_steps=streak)
    calibrator = cache_dit.TaylorSeerCalibratorConfig(taylorseer_order=order) if order else None
    cache_dit.enable_cache(pipe, cache_config=config, calibrator_config=calibrator)
    frames = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, **KW, output_type="np",
                  generator=torch.Generator("cpu").manual_seed(SEED)).frames[0]
    stats = cache_dit.summary(pipe, logging=False)[0]
    return frames, [list(stats.cached_steps), list(stats.cfg_cached_steps)]


def _vidloom(folder: Path, monkeypatch, fn: int, bn: int, threshold: float, order: int, streak: int):
    decisions: list[list[list[int]]] = []

    def spy(*args, **kwargs):
        cache = make(*args, **kwargs)
        close = cache.close

        def keep_then_close() -> None:  # the run clears its branches when it ends
            # Sequential CFG: the step's first network call is the conditional branch, the second the unconditional.
            ordered = sorted(cache._branches.items(), key=lambda item: item[0][2])
            decisions.append([branch.cached_steps for _, branch in ordered])
            close()

        cache.close = keep_then_close
        return cache

    make = request_run.make_step_cache
    monkeypatch.setattr(request_run, "make_step_cache", spy)
    deploy = DeployConfig(step_cache="dbcache", step_cache_threshold=threshold, step_cache_fn=fn, step_cache_bn=bn,
                          step_cache_warmup=1, step_cache_max_continuous=streak, step_cache_taylorseer=order)
    gen = VideoGenerator.from_pretrained(folder, device="cpu", deploy=deploy)
    out = gen.engine.run(GenerationRequest(prompt=PROMPT, negative_prompt=NEGATIVE, **KW, seed=SEED))
    (cached_steps,) = decisions
    return out, cached_steps


@pytest.mark.parametrize("case", CASES)
def test_dbcache_matches_cache_dit(tiny4_dir, monkeypatch, case):
    settings = CASES[case]
    expected, expected_steps = _cache_dit(tiny4_dir, *settings)
    out, cached_steps = _vidloom(tiny4_dir, monkeypatch, *settings)
    assert cached_steps == expected_steps and expected_steps[0], case
    report = out["step_cache"]
    assert report["settings"]["fn"] == settings[0] and report["settings"]["taylorseer"] == settings[3]
    diff = float(np.abs(out["video"] - expected).max())
    assert diff <= TOLERANCE, f"{case}: max abs diff {diff:.3e}"
