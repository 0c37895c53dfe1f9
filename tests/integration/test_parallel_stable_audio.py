"""Stable Audio on several CPU processes (gloo): --sp 2 (and --cfg-parallel) match one process (issue #35).

sp=2 runs in every suite; sp=2 x cfg=2 starts four ranks and is marked slow, like test_parallel_mmdit.py's. The tiny
DiT's window is 32 latent steps behind the global token: 33 rows, padded to split over 2.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.stable_audio_checkpoints import TINY_STEREO, write_tiny_stable_audio
from vidloom.core.errors import InvalidRequest
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator
from vidloom.runtime.parallel.worker import PoolOptions

# fp32 on CPU: the exchanges copy values, only summation order inside kernels changes (<= ~1e-7 on the DiT output
# in tests/unit/runtime/parallel/test_joint_sp.py); 1e-5 on the waveform still catches one misplaced row or head.
FP32_TOL = 1e-5
PLANS = [pytest.param(ParallelPlan(sp=2), id="sp2"),
         pytest.param(ParallelPlan(sp=2, cfg=2), id="sp2xcfg2", marks=pytest.mark.slow)]
OPTIONS = PoolOptions(collective_timeout_s=60, check_lockstep=True)
REQUEST = dict(task=Task.T2A, prompt="rain on a tin roof", negative_prompt="hiss", seconds=0.5,
               num_inference_steps=2, guidance_scale=5.0, seed=3)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = write_tiny_stable_audio(tmp_path_factory.mktemp("stable-audio"), TINY_STEREO)
    engine = VideoGenerator.from_pretrained(folder, device="cpu").engine
    return folder, engine.run(GenerationRequest(**REQUEST))["audio"]


@pytest.mark.parametrize("plan", PLANS)
def test_the_pool_matches_one_process(checkpoint, plan):
    folder, expected = checkpoint
    with VideoGenerator.from_pretrained(folder, device="cpu", parallel=plan, pool_options=OPTIONS) as gen:
        out = gen.engine.run(GenerationRequest(**REQUEST))["audio"]
        assert out.shape == expected.shape and float(np.abs(np.asarray(out) - np.asarray(expected)).max()) <= FP32_TOL
        if plan.cfg > 1:
            with pytest.raises(InvalidRequest) as err:
                gen.engine.submit(GenerationRequest(**{**REQUEST, "guidance_scale": 1.0}))
            assert err.value.field == "guidance_scale"
