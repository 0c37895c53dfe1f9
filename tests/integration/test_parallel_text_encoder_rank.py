"""--text-encoder-rank on real pools (gloo, CPU, float32): one rank holds the text encoder and broadcasts the encoded
prompt; the video is bitwise the replicated-encoder pool's, and the ranks without the encoder hold its weights less.

Wan (wan2.1-demo; its encoder offloaded and its prompt cache on, on the owning rank, with a repeated prompt) and
HunyuanVideo-1.5 (its encoded prompt is a dataclass of two tensors per prompt, negative included) each start two
pools of two ranks: replicated, then the encoder on rank 1, so rank 0 (which answers the parent) receives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers.hunyuan15_checkpoints import write_pipeline as write_hunyuan15
from vidloom.core.deploy import DeployConfig
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime.parallel.comm import GroupComm
from vidloom.runtime.parallel.prompt_rank import receive, send
from vidloom.runtime.parallel.shard_weights import held_weight_bytes
from vidloom.runtime.parallel.worker import PoolOptions

OPTIONS = PoolOptions(collective_timeout_s=60, check_lockstep=True)
# 32x48 with 5 frames: a 2x2x3 patch grid (12 tokens) splits over sp=2 for both demos.
WAN_REQUESTS = [dict(prompt="a red fox in the snow", negative_prompt="blurry", height=32, width=48, num_frames=5,
                     num_inference_steps=2, guidance_scale=5.0, seed=seed) for seed in (7, 8)]  # the 2nd hits the cache
HUNYUAN15_REQUESTS = [dict(prompt="a red fox", negative_prompt="blurry", height=32, width=48, num_frames=5,
                           num_inference_steps=2, guidance_scale=5.0, seed=7)]
WAN_DEPLOY = dict(offload_text_encoder=True, prompt_cache_size=4)


def _pool_run(model: str | Path, cache_dir: Path, requests: list[dict[str, Any]], owner: int | None,
              **deploy: Any) -> tuple[list[np.ndarray], list[int]]:
    plan = ParallelPlan(sp=2, text_encoder_rank=owner)
    with VideoGenerator.from_pretrained(model, device="cpu", cache_dir=cache_dir, pool_options=OPTIONS,
                                        deploy=DeployConfig(devices=2, parallel=plan, **deploy)) as gen:
        videos = [gen.engine.run(GenerationRequest(**r))["video"] for r in requests]
        held = gen.engine.weight_bytes()
        assert not gen.engine.broken
    return videos, held


def _encoder_bytes(model: str | Path, cache_dir: Path, **deploy: Any) -> int:
    instance = VideoGenerator.from_pretrained(model, device="cpu", cache_dir=cache_dir,
                                              deploy=DeployConfig(**deploy)).engine.instance
    return held_weight_bytes({"text_encoder": instance["text_encoder"]})


@pytest.fixture(scope="module")
def hunyuan15(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hunyuan15")
    write_hunyuan15(folder, "p1")  # two heads: sp=2 divides them
    return folder


@pytest.mark.parametrize("family", ["wan", "hunyuan15"])
def test_one_rank_encodes_and_the_video_is_the_replicated_pools(family, demo_cache, request):
    model, requests, deploy = (("wan2.1-demo", WAN_REQUESTS, WAN_DEPLOY) if family == "wan"
                               else (request.getfixturevalue("hunyuan15"), HUNYUAN15_REQUESTS, {}))
    replicated, held_everywhere = _pool_run(model, demo_cache, requests, None, **deploy)
    placed, held_placed = _pool_run(model, demo_cache, requests, 1, **deploy)
    for want, got in zip(replicated, placed):
        assert got.dtype == np.float32 and np.array_equal(got, want)  # the broadcast copies the embeddings' bits
    encoder = _encoder_bytes(model, demo_cache, **deploy)
    assert encoder > 0
    assert held_placed[1] == held_everywhere[1] == held_everywhere[0]  # the owner holds what every rank held
    assert held_placed[0] == held_everywhere[0] - encoder  # rank 0 holds no byte of the encoder
    print(f"{family}: weight bytes per rank replicated {held_everywhere}, encoder on rank 1 {held_placed}, "
          f"text encoder {encoder}")


# fp32: the plans' exchanges copy values; only summation order inside kernels changes (tests/integration/
# test_parallel.py's bound). Observed: 1.1e-6 for both.
FP32_TOL = 1e-5


@pytest.mark.parametrize("plan", [ParallelPlan(sp=2, shard_weights=True, text_encoder_rank=0),
                                  ParallelPlan(cfg=2, text_encoder_rank=1)], ids=["sp2-sharded-rank0", "cfg2-rank1"])
def test_it_combines_with_sharded_weights_and_cfg_parallel(plan, demo_cache):
    request = GenerationRequest(**WAN_REQUESTS[0])
    one = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache).engine
    with VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache, pool_options=OPTIONS,
                                        deploy=DeployConfig(devices=2, parallel=plan)) as gen:
        video = gen.engine.run(request)["video"]
        held = gen.engine.weight_bytes()
    assert float(np.abs(video - one.run(request)["video"]).max()) <= FP32_TOL
    encoder = held_weight_bytes({"text_encoder": one.instance["text_encoder"]})
    owner = plan.text_encoder_rank
    if plan.shard_weights:  # both ranks hold half the blocks; only the owner holds the encoder
        assert held[owner] - held[1 - owner] == encoder
    else:
        assert held[owner] - held[1 - owner] == encoder and held[owner] == held_weight_bytes(one.instance.components)


def _written() -> dict[str, Any]:
    """A prompt node's slots in every dtype an encoder may write, including ones gloo does not broadcast itself."""
    g = torch.Generator().manual_seed(0)
    return {"embeds": torch.randn(2, 3, generator=g).to(torch.bfloat16), "mask": torch.tensor([True, False]),
            "complex": torch.randn(2, generator=g, dtype=torch.complex64), "scalar": torch.tensor(3.5),
            "half": torch.randn(4, generator=g).half(), "none": None, "pair": (torch.arange(3, dtype=torch.int32), "x")}


def _gloo_rank(rank: int, rendezvous: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    world = GroupComm(dist.group.WORLD, rank, 2)
    try:
        if rank == 1:
            send(world, _written(), torch.device("cpu"))
            return
        got, want = receive(world, 1, torch.device("cpu")), _written()
        for key in ("embeds", "mask", "complex", "scalar", "half"):
            assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
        assert got["none"] is None and torch.equal(got["pair"][0], want["pair"][0]) and got["pair"][1] == "x"
    finally:
        dist.destroy_process_group()


def test_every_dtype_crosses_gloo_bit_for_bit(tmp_path):
    mp.spawn(_gloo_rank, args=(str(tmp_path / "rendezvous"),), nprocs=2)  # raises if rank 0's checks fail
