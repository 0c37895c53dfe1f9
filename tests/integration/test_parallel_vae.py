"""Parallel VAE decode on several CPU processes (gloo): with --vae-tile, the ranks of a parallel plan split the
tiles (each decodes every P-th, then they exchange them), and the video equals one process's tiled decode."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
from vidloom.core.deploy import DeployConfig
from vidloom.core.output import ProgressEvent
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime.parallel.worker import PoolOptions

# 32x48 with 8x latents is a 4x6 latent: 32-pixel tiles every 16 are 2 x 3 = 6 tiles, 3 per rank.
REQUEST = dict(prompt="a red fox in the snow", height=32, width=48, num_frames=5, num_inference_steps=2, seed=7,
               guidance_scale=5.0)
TILES = dict(vae_tile=32, vae_tile_stride=16)
OPTIONS = PoolOptions(collective_timeout_s=30, check_lockstep=True)


@pytest.fixture(scope="module")
def tiny_a(tmp_path_factory):
    folder = write_tiny_wan(tmp_path_factory.mktemp("tiny-a"), TINY_A)
    one = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(**TILES)).engine.run(
        GenerationRequest(**REQUEST))
    return folder, one


# cfg=2 shares the tiles over the same world group as sp=2 does: one plan in every suite, the other marked slow.
@pytest.mark.parametrize("plan", [ParallelPlan(sp=2), pytest.param(ParallelPlan(cfg=2), marks=pytest.mark.slow)],
                         ids=["sp2", "cfg2"])
def test_the_ranks_split_the_tiles_and_match_one_process(tiny_a, plan):
    folder, one = tiny_a
    events: list[ProgressEvent] = []
    deploy = DeployConfig(**TILES, devices=plan.world_size, parallel=plan)
    with VideoGenerator.from_pretrained(folder, device="cpu", deploy=deploy, pool_options=OPTIONS) as gen:
        pool = gen.engine.run(GenerationRequest(**REQUEST), on_event=events.append)
    assert float(np.abs(pool["video"] - one["video"]).max()) <= 1e-5
    decode = [e for e in events if isinstance(e, ProgressEvent) and e.phase == "decode"]
    # Rank 0 decodes 3 of the 6 tiles (2 latent frames each) and counts its progress to its own share.
    assert decode and decode[-1].step == decode[-1].total == 3 * 2
