"""SANA-WM on several CPU processes (gloo): --sp 2, --cfg-parallel and both match one process (issue #35).

Stage 1's tokens shard in bands of patch rows of every frame (families/sana_wm/parallel.py). Two configurations:
sana-wm-demo (2 x 3 patches a frame: one row per rank), and a second tiny checkpoint (three blocks, Q/K/V short
convolutions, 4 x 3 patches: two rows per rank, so the FFN's 3x3 halo crosses a band edge) deployed --two-stage, its
refiner (4 heads, interleaved rotary, gated attention) sharded too: each rank keeps half of the chunk's tokens and
half of the heads of its window (families/sana_wm/refiner_parallel.py). sp=2 and cfg=2 run in every suite (two
ranks, one thread each on a 2-core machine); sp=2 x cfg=2 starts four ranks and is marked slow, like
test_parallel_mmdit.py's. A refiner whose heads sp does not divide (SANA_WM_B's 3) runs whole on every rank.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.helpers.sana_wm_checkpoints import SANA_WM_B, TinySanaWM, write_tiny_refiner, write_tiny_sana_wm
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import InvalidRequest
from vidloom.core.parallel import ParallelPlan
from vidloom.families.sana_wm.demo import ensure_demo_checkpoint
from vidloom.generator import VideoGenerator, build_request
from vidloom.runtime.parallel.worker import PoolOptions

# fp32 on CPU: the exchanges copy values; the frame-mean gate adds the bands' sums in rank order and kernels see
# smaller shapes (<= 1e-6 of the DiT's peak in tests/unit/families/test_sana_wm_sp.py). 1e-5 on frames in [0, 1]
# still catches one misplaced row, head or halo.
FP32_TOL = 1e-5
PLANS = [pytest.param(ParallelPlan(sp=2), id="sp2"), pytest.param(ParallelPlan(cfg=2), id="cfg2"),
         pytest.param(ParallelPlan(sp=2, cfg=2), id="sp2xcfg2", marks=pytest.mark.slow)]
OPTIONS = PoolOptions(collective_timeout_s=120, check_lockstep=True)
FIRST = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8))
BASE = dict(image=FIRST, camera="w-8,jw-8", negative_prompt="blurry", guidance_scale=5.0, num_inference_steps=2,
            seed=7)
DEMO_REQUEST = dict(BASE, prompt="a quiet forest path", height=64, width=96, num_frames=9, intrinsics=[100, 100, 48, 32])
# SANA_WM_B with a refiner of 4 heads of 6 (its 3 heads of 8 do not split over 2 ranks): the same width.
SANA_WM_B_SP = dataclasses.replace(SANA_WM_B, name="sana-wm-b-sp", refiner={
    **(SANA_WM_B.refiner or {}), "num_attention_heads": 4, "attention_head_dim": 6})
# 4 x 3 patches a frame, 3 latent frames; the refiner's window streams the video.
SECOND_REQUEST = dict(BASE, prompt="a car driving", height=128, width=96, num_frames=17, intrinsics=[90, 90, 48, 64])


def _result(gen: VideoGenerator, fields: dict[str, Any]) -> dict[str, Any]:
    request = dict(fields)
    return gen.engine.run(build_request(gen.card, request.pop("prompt"), **request))


def _run(gen: VideoGenerator, fields: dict[str, Any]) -> np.ndarray:
    return np.asarray(_result(gen, fields)["video"])


@pytest.fixture(scope="module")
def demo(demo_cache) -> tuple[Path, DeployConfig, dict[str, Any], np.ndarray]:
    folder = ensure_demo_checkpoint(demo_cache)
    return folder, DeployConfig(), DEMO_REQUEST, _run(VideoGenerator.from_pretrained(folder, device="cpu"),
                                                      DEMO_REQUEST)


def _two_stage(folder: Path, spec: TinySanaWM) -> tuple[Path, DeployConfig, dict[str, Any], np.ndarray]:
    write_tiny_sana_wm(folder, spec)
    write_tiny_refiner(folder, spec)
    deploy = DeployConfig(two_stage=True)
    gen = VideoGenerator.from_pretrained(folder, device="cpu", deploy=deploy)
    return folder, deploy, SECOND_REQUEST, _run(gen, SECOND_REQUEST)


@pytest.fixture(scope="module")
def second(tmp_path_factory) -> tuple[Path, DeployConfig, dict[str, Any], np.ndarray]:
    return _two_stage(tmp_path_factory.mktemp("sana-wm-b-sp"), SANA_WM_B_SP)


@pytest.mark.parametrize("config", ["demo", "second"])
@pytest.mark.parametrize("plan", PLANS)
def test_the_pool_matches_one_process(config, plan, request):
    folder, deploy, fields, expected = request.getfixturevalue(config)
    assert float(expected.std()) > 0.01
    with VideoGenerator.from_pretrained(folder, device="cpu", deploy=deploy, parallel=plan,
                                        pool_options=OPTIONS) as gen:
        out = _run(gen, fields)
        assert out.shape == expected.shape and float(np.abs(out - expected).max()) <= FP32_TOL
        if plan.sp > 1:  # 3 patch rows a frame do not split in two bands: refused at submit
            rest = {k: v for k, v in fields.items() if k != "prompt"}
            with pytest.raises(InvalidRequest, match="3 patch rows per frame") as err:
                gen.engine.submit(build_request(gen.card, "x", **{**rest, "height": 96}))
            assert err.value.field == "height"


def test_a_step_cache_under_sp_skips_the_same_steps_as_one_process(demo):
    """The change measure sums over the ranks' bands (no pad rows), so both ranks take one device's decisions."""
    folder = demo[0]
    fields = dict(DEMO_REQUEST, num_inference_steps=8, step_cache_threshold=0.2)
    one = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(step_cache="fbcache"))
    expected = _result(one, fields)
    deploy = DeployConfig(step_cache="fbcache", devices=2, parallel=ParallelPlan(sp=2))
    with VideoGenerator.from_pretrained(folder, device="cpu", deploy=deploy, pool_options=OPTIONS) as gen:
        got = _result(gen, fields)
    assert expected["step_cache"]["skipped_steps"] > 0 and expected["step_cache"]["computed_steps"] > 1
    assert got["step_cache"] == expected["step_cache"]
    assert float(np.abs(np.asarray(got["video"]) - np.asarray(expected["video"])).max()) <= FP32_TOL


def test_a_refiner_whose_heads_do_not_split_runs_whole_on_every_rank(tmp_path):
    """SANA_WM_B's refiner has 3 heads: under --sp 2 stage 1 shards and the refiner runs as on one device."""
    folder, deploy, fields, expected = _two_stage(tmp_path, SANA_WM_B)
    with VideoGenerator.from_pretrained(folder, device="cpu", deploy=deploy, parallel=ParallelPlan(sp=2),
                                        pool_options=OPTIONS) as gen:
        out = _run(gen, fields)
    assert out.shape == expected.shape and float(np.abs(out - expected).max()) <= FP32_TOL
