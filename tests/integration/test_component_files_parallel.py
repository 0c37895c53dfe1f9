"""Component overrides reach every worker of a multi-device pool: sp=2 on CPU (gloo) with the transformer from an
original-layout file gives the one-process video with the same file."""

from __future__ import annotations

import numpy as np

from tests.helpers.single_files import random_state, save, to_original
from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.models.wan.original_layout import WAN_ORIGINAL
from vidloom.runtime.parallel.worker import PoolOptions

# As tests/integration/test_parallel.py: the collectives copy values exactly, only summation order inside kernels
# may change (observed 0 there); 1e-5 on the float video still catches a rank running other weights.
FP32_TOL = 1e-5
SMALL = dict(prompt="a red fox in the snow", height=32, width=48, num_frames=5, num_inference_steps=2, seed=7)


def test_sp2_workers_read_the_override(tmp_path):
    from diffusers import WanTransformer3DModel

    folder = write_tiny_wan(tmp_path / "wan", TINY_A)
    state = random_state(WanTransformer3DModel.from_pretrained(str(folder / "transformer")), seed=11)
    file = save(to_original(WAN_ORIGINAL, state), tmp_path / "wan_original.safetensors")
    request = GenerationRequest(**SMALL)
    components = {"transformer": file}
    one = VideoGenerator.from_pretrained(folder, device="cpu", dtype="float32", components=components)
    expected = one.engine.run(request)["video"]
    folder_only = VideoGenerator.from_pretrained(folder, device="cpu", dtype="float32").engine.run(request)["video"]
    assert float(np.abs(expected - folder_only).max()) > 1e-2, "the file's weights must change the video"
    options = PoolOptions(collective_timeout_s=30, check_lockstep=True)
    with VideoGenerator.from_pretrained(folder, device="cpu", dtype="float32", components=components,
                                        parallel=ParallelPlan(sp=2), pool_options=options) as pool:
        got = pool.engine.run(request)["video"]
    assert float(np.abs(got - expected).max()) <= FP32_TOL
