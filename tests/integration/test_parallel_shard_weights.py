"""--shard-weights on a real pool (tiny Wan2.1, two gloo processes, float32): the video equals one process's, with a
step cache and with a LoRA adapter loaded on every rank too (the gathers pair up whatever the steps skip)."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

from tests.helpers.lora_files import WAN_LORA as SPEC, WAN_LORA_REQUEST as KW, write_lora
from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
from vidloom.core.deploy import DeployConfig
from vidloom.core.parallel import ParallelPlan
from vidloom.generator import VideoGenerator
from vidloom.runtime.parallel.worker import PoolOptions

OPTIONS = PoolOptions(collective_timeout_s=30, check_lockstep=True)
CACHE = dict(step_cache="fbcache", step_cache_threshold=0.2)


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    folder = write_tiny_wan(tmp_path_factory.mktemp("wan"), TINY_A)
    return folder, write_lora(folder, "WanPipeline", SPEC, tmp_path_factory.mktemp("loras"))


@pytest.fixture(scope="module")
def sharded(wan) -> Iterator[VideoGenerator]:
    plan = ParallelPlan(sp=2, shard_weights=True)
    with VideoGenerator.from_pretrained(wan[0], device="cpu", deploy=DeployConfig(devices=2, parallel=plan, **CACHE),
                                        pool_options=OPTIONS) as gen:
        yield gen


def test_sharded_weights_give_one_processs_video_with_a_step_cache_and_an_adapter(sharded, wan):
    one = VideoGenerator.from_pretrained(wan[0], device="cpu", deploy=DeployConfig(**CACHE))
    one.load_lora("a", wan[1])
    sharded.load_lora("a", wan[1])
    for loras in (None, {"a": 0.8}):
        expected = one.generate("a kite", loras=loras, **{**KW, "num_inference_steps": 6})
        got = sharded.generate("a kite", loras=loras, **{**KW, "num_inference_steps": 6})
        assert np.abs(got.frames.astype(int) - expected.frames.astype(int)).max() <= 1, loras
        assert got.metadata["step_cache"]["skipped_steps"] == expected.metadata["step_cache"]["skipped_steps"] > 0
    assert not sharded.engine.broken
