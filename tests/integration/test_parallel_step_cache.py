"""Step caches under parallel plans on several CPU processes (gloo): under --sp every rank of the group takes the
same skip decisions (the change measure sums over the ranks' token shards), under --cfg-parallel each rank decides
its own branch as one device does per branch; either way the video and the skips equal one process's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.wan_checkpoints import TINY_A, TINY_B, write_tiny_wan
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime.parallel.worker import PoolOptions

FP32_TOL = 1e-5  # as tests/integration/test_parallel.py: the exchanges copy values, only kernel sums reorder
# fbcache at 0.2 on these tiny random checkpoints skips some steps and computes others (5 of 8 skipped one-device).
REQUEST = dict(prompt="a red fox in the snow", height=32, width=48, num_frames=5, num_inference_steps=8, seed=7,
               guidance_scale=5.0, step_cache_threshold=0.2)
CACHE = dict(step_cache="fbcache")
OPTIONS = PoolOptions(collective_timeout_s=30, check_lockstep=True)


def _one_process(folder: Path) -> dict:
    return VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(**CACHE)).engine.run(
        GenerationRequest(**REQUEST))


def _pool(folder: Path, plan: ParallelPlan) -> dict:
    deploy = DeployConfig(**CACHE, devices=plan.world_size, parallel=plan)
    with VideoGenerator.from_pretrained(folder, device="cpu", deploy=deploy, pool_options=OPTIONS) as gen:
        return gen.engine.run(GenerationRequest(**REQUEST))


def test_sp2_ranks_skip_the_same_steps_as_one_process(tmp_path):
    folder = write_tiny_wan(tmp_path / "tiny-a", TINY_A)  # 2 heads: Ulysses over 2 ranks, even token split
    one, pool = _one_process(folder), _pool(folder, ParallelPlan(sp=2))
    assert one["step_cache"]["skipped_steps"] > 0 and one["step_cache"]["computed_steps"] > 1
    assert pool["step_cache"] == one["step_cache"]
    assert float(np.abs(pool["video"] - one["video"]).max()) <= FP32_TOL


def test_cfg2_ranks_each_decide_their_branch_and_say_whose_counts(tmp_path):
    folder = write_tiny_wan(tmp_path / "tiny-b", TINY_B)
    one, pool = _one_process(folder), _pool(folder, ParallelPlan(cfg=2))
    assert float(np.abs(pool["video"] - one["video"]).max()) <= FP32_TOL
    report = pool["step_cache"]
    assert report["counts"].startswith("the conditional branch's (cfg-rank 0)")
    assert report["total_blocks"] * 2 == one["step_cache"]["total_blocks"]  # one branch of the two
    assert 0 < report["skipped_blocks"] <= one["step_cache"]["skipped_blocks"]


def test_a_padded_layout_refuses_a_step_cache_under_sp_before_any_process_starts(tmp_path):
    from tests.helpers.flux2_checkpoints import TINY_BASE, write_tiny_flux2

    folder = write_tiny_flux2(tmp_path / "klein", TINY_BASE)
    deploy = DeployConfig(**CACHE, devices=2, parallel=ParallelPlan(sp=2))
    with pytest.raises(DeployError, match="pad rows would enter the cache's change measure"):
        VideoGenerator.from_pretrained(folder, device="cpu", deploy=deploy)
