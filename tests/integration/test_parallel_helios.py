"""Helios on several CPU processes (gloo): --sp 2, --cfg-parallel and both match one process (issue #35).

Two chunks each, so the second chunk's history tokens (long, mid, short, patchified at 4x, 2x and 1x) are sharded
with the chunk's. helios-demo (2 heads: Ulysses) runs the base pipeline's classic CFG; the second config is a
2-stage pyramid with CFG-Zero* on a 3-head transformer, so sp=2 runs ring attention and the CFG-Zero* combine runs
on both ranks of a pair. sp=2 and cfg=2 run in every suite; sp=2 x cfg=2 starts four ranks and is marked slow, like
test_parallel_mmdit.py's.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.helios_checkpoints import PYRAMID_B, write_tiny_helios_pyramid
from tests.helpers.pool_checks import check_pool_video
from vidloom.core.errors import DeployError
from vidloom.core.parallel import ParallelPlan
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime.parallel.worker import PoolOptions

# fp32 on CPU: the exchanges copy values, only summation order inside kernels changes (<= ~2e-7 on the DiT output in
# tests/unit/runtime/parallel/test_joint_sp.py); 1e-5 on the decoded float video still catches one misplaced row,
# head or history term.
FP32_TOL = 1e-5
PLANS = [pytest.param(ParallelPlan(sp=2), id="sp2"), pytest.param(ParallelPlan(cfg=2), id="cfg2"),
         pytest.param(ParallelPlan(sp=2, cfg=2), id="sp2xcfg2", marks=pytest.mark.slow)]
OPTIONS = PoolOptions(collective_timeout_s=60, check_lockstep=True)
# The demo's 64x96: 216 chunk rows behind 62 history rows (48 short, 6 mid, 8 long) on the second chunk.
DEMO_REQUEST = dict(prompt="a paper boat", negative_prompt="blurry", num_frames=65, num_inference_steps=2,
                    guidance_scale=5.0, seed=5)
# 32x64 over 2 stages (2 + 2 steps): the chunk is 9 x 1 x 2 rows in stage 1, 9 x 2 x 4 in stage 2.
PYRAMID_ZERO_STAR = dataclasses.replace(PYRAMID_B, zero_star=True)
PYRAMID_REQUEST = dict(prompt="a paper boat", negative_prompt="blurry", height=32, width=64, num_frames=65,
                       num_inference_steps=4, guidance_scale=5.0, seed=5)


def _one_process(model: str | Path, request: dict[str, Any], **kwargs: Any) -> np.ndarray:
    return VideoGenerator.from_pretrained(model, device="cpu", **kwargs).engine.run(GenerationRequest(**request))["video"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[str, dict[str, Any], dict[str, Any], np.ndarray]:
    where = {"cache_dir": tmp_path_factory.mktemp("cache")}
    return "helios-demo", where, DEMO_REQUEST, _one_process("helios-demo", DEMO_REQUEST, **where)


@pytest.fixture(scope="module")
def pyramid(tmp_path_factory) -> tuple[Path, dict[str, Any], dict[str, Any], np.ndarray]:
    folder = write_tiny_helios_pyramid(tmp_path_factory.mktemp("pyramid"), PYRAMID_ZERO_STAR)
    return folder, {}, PYRAMID_REQUEST, _one_process(folder, PYRAMID_REQUEST)


@pytest.mark.parametrize("config", ["demo", "pyramid"])
@pytest.mark.parametrize("plan", PLANS)
def test_the_pool_matches_one_process(config, plan, request, caplog):
    model, where, kwargs, expected = request.getfixturevalue(config)
    caplog.set_level(logging.INFO)
    with VideoGenerator.from_pretrained(model, device="cpu", parallel=plan, pool_options=OPTIONS, **where) as gen:
        check_pool_video(gen, plan, GenerationRequest(**kwargs), expected, FP32_TOL, f"helios {config}")
    if plan.sp > 1:  # 3 heads do not split over 2 ranks: the pyramid's transformer attends through the ring
        assert ("ring attention" in caplog.text) == (config == "pyramid"), caplog.text


def test_a_step_cache_under_sp_is_refused_before_any_process_starts(demo):
    model, where, _, _ = demo
    deploy = DeployConfig(step_cache="fbcache")
    with pytest.raises(DeployError, match="padded to split"):
        VideoGenerator.from_pretrained(model, device="cpu", parallel=ParallelPlan(sp=2), deploy=deploy, **where)
