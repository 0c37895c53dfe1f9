"""AnyFlow-FAR on several CPU processes (gloo): --sp 2, --cfg-parallel and both (4 ranks) match one process (#35).

Every chunk's tokens and its KV in the slab are sharded per chunk (families/wan_causal/parallel.py). far-demo (2
heads: Ulysses) at 48x80: 15 tokens a full frame and 2 a compressed one, so every chunk and the null keys are padded to
split; three chunks, the third attending to a compressed first one. The second config (tests/helpers/far_checkpoints
FAR_B) has 3 heads (sp=2 runs ring attention), 8 latent channels, chunks (1, 1, 2, 1) with two kept at full
resolution, and its compressed chunks are one token each. Under --cfg-parallel each rank runs one branch with the KV
slab of that branch. sp=2 on both configs and cfg=2 on the demo run in every suite; the rest start more ranks or
repeat a path and are marked slow, like test_parallel_helios.py's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.far_checkpoints import FAR_B, write_tiny_far
from tests.helpers.pool_checks import check_pool_video
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime.parallel.worker import PoolOptions

# fp32 on CPU: the exchanges copy values; only summation order changes (keys gathered in rank order, ring attention's
# float32 blocks, kernels on shards, a CFG branch as a forward of one sample instead of one of two): <= 6e-7 on the
# DiT output in tests/unit/families/test_far_sp.py; on the decoded frames (std 0.15-0.3) observed 3.5e-6 (demo) and
# 6.3e-6 (far-b: ring attention, five chunks). 2e-5 still catches one misplaced row, head or pad key (1e-3 and more).
FP32_TOL = 2e-5
OPTIONS = PoolOptions(collective_timeout_s=60, check_lockstep=True)
SLOW = pytest.mark.slow
REQUESTS = {
    "demo": dict(height=48, width=80, num_frames=17),
    "far-b": dict(height=32, width=48, num_frames=17),
}
CASES = [
    pytest.param("demo", ParallelPlan(sp=2), id="demo-sp2"),
    pytest.param("demo", ParallelPlan(cfg=2), id="demo-cfg2"),
    pytest.param("demo", ParallelPlan(sp=2, cfg=2), id="demo-sp2xcfg2", marks=SLOW),
    # each block's weights gathered for the prompt K/V prepared once per request, as around its forwards
    pytest.param("demo", ParallelPlan(sp=2, shard_weights=True), id="demo-sp2shard"),
    pytest.param("far-b", ParallelPlan(sp=2), id="far-b-sp2"),
    pytest.param("far-b", ParallelPlan(cfg=2), id="far-b-cfg2", marks=SLOW),
    pytest.param("far-b", ParallelPlan(sp=2, cfg=2), id="far-b-sp2xcfg2", marks=SLOW),
]


def _request(config: str, **change: Any) -> GenerationRequest:
    fields = dict(prompt="a paper boat", negative_prompt="blurry", num_inference_steps=2, guidance_scale=3.0, seed=4)
    return GenerationRequest(**{**fields, **REQUESTS[config], **change})


@pytest.fixture(scope="module")
def models(demo_cache: Path, tmp_path_factory) -> dict[str, tuple[str | Path, dict[str, Any], Any]]:
    """Each config's model, where to find it, and its video on one process."""
    found: dict[str, tuple[str | Path, dict[str, Any]]] = {
        "demo": ("far-demo", {"cache_dir": demo_cache}),
        "far-b": (write_tiny_far(tmp_path_factory.mktemp("far") / "far-b", FAR_B), {}),
    }
    return {config: (model, where, VideoGenerator.from_pretrained(model, device="cpu", **where).engine.run(
        _request(config))["video"]) for config, (model, where) in found.items()}


@pytest.mark.parametrize(("config", "plan"), CASES)
def test_the_pool_matches_one_process(models, config, plan, caplog):
    model, where, expected = models[config]
    caplog.set_level(logging.INFO)
    with VideoGenerator.from_pretrained(model, device="cpu", parallel=plan, pool_options=OPTIONS, **where) as gen:
        check_pool_video(gen, plan, _request(config), expected, FP32_TOL, f"far {config}")
    if plan.sp > 1:  # 3 heads do not split over 2 ranks: far-b's self-attention goes around the ring
        assert ("ring attention" in caplog.text) == (config == "far-b"), caplog.text


@pytest.mark.parametrize(("deploy", "match"), [
    (dict(parallel=ParallelPlan(sp=2), step_cache="fbcache"), "padded to split"),
])
def test_what_the_layout_refuses_is_refused_before_any_process_starts(demo_cache, deploy, match):
    with pytest.raises(DeployError, match=match):
        VideoGenerator.from_pretrained("far-demo", device="cpu", cache_dir=demo_cache,
                                       deploy=DeployConfig(**{k: v for k, v in deploy.items() if k != "parallel"}),
                                       parallel=deploy["parallel"])
