"""MMDiT families on several CPU processes (gloo): Flux2 and Qwen-Image under --sp 2 --cfg-parallel match one process.

One pool of four ranks per family (sp=2 x cfg=2), the most a CI machine with 2 cores should start; each rank
gets one thread. The requests are sized so the joined [text, image] stream does not split evenly (padded).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.helpers.flux2_checkpoints import TINY_BASE, flux2_dit, write_tiny_flux2
from tests.helpers.qwen_image_checkpoints import write_qwen_image_wide
from vidloom.core.errors import InvalidRequest
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator
from vidloom.runtime.parallel.worker import PoolOptions

# fp32 on CPU: the exchanges copy values; ranks run smaller matmuls on one thread, so only summation order
# inside kernels changes (<= ~2e-7 on the DiT output in tests/unit/runtime/parallel/test_joint_sp.py).
# 1e-5 on the decoded float image still catches one misplaced row or head.
FP32_TOL = 1e-5
PLAN = ParallelPlan(sp=2, cfg=2)
OPTIONS = PoolOptions(collective_timeout_s=60, check_lockstep=True)
# Two heads (sp=2 divides them), base Klein (classic CFG).
FLUX2_TWO_HEADS = dataclasses.replace(TINY_BASE, name="klein-base-2h", transformer=flux2_dit(
    in_channels=32, layers=2, single_layers=1, head_dim=8, heads=2, text_width=48, time_channels=16, rope_axis=2))
# 512 text tokens + a 3x3 image grid = 521 rows: padded to 522 over sp=2.
FLUX2_REQUEST = dict(task=Task.T2I, prompt="a red fox", height=48, width=48, num_frames=1, num_inference_steps=2,
                     guidance_scale=4.0, seed=3)
QWEN_REQUEST = dict(task=Task.T2I, prompt="a red fox in the snow", negative_prompt="blurry", height=48, width=48,
                    num_frames=1, num_inference_steps=2, guidance_scale=4.0, seed=5)


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    return float(np.abs(a - b).max())


def _matches_one_process(folder: Path, requests: list[dict[str, Any]], refused: list[dict[str, Any]]) -> None:
    """Each of `requests` equals one process's run; each change in `refused` is refused at submit, naming its field."""
    single = VideoGenerator.from_pretrained(folder, device="cpu").engine
    expected = [single.run(GenerationRequest(**r))["video"] for r in requests]
    with VideoGenerator.from_pretrained(folder, device="cpu", parallel=PLAN, pool_options=OPTIONS) as gen:
        for request, reference in zip(requests, expected):
            assert _max_diff(gen.engine.run(GenerationRequest(**request))["video"], reference) <= FP32_TOL
        for change in refused:
            with pytest.raises(InvalidRequest) as err:
                gen.engine.submit(GenerationRequest(**{**requests[0], **change}))
            assert err.value.field in change


def test_flux2_sp2_x_cfg2_matches_one_process_with_a_reference_image(tmp_path):
    folder = write_tiny_flux2(tmp_path / "klein", FLUX2_TWO_HEADS)
    rng = np.random.default_rng(0)
    reference = Image.fromarray(rng.integers(0, 256, (64, 80, 3), dtype=np.uint8))
    edit = {**FLUX2_REQUEST, "image": (reference,), "prompt": "make it purple"}
    # Flux2's negative prompt may be empty (the pipeline's is ""): CFG still runs.
    _matches_one_process(folder, [FLUX2_REQUEST, edit], [{"guidance_scale": 1.0}])


def test_qwen_image_sp2_x_cfg2_matches_one_process(tmp_path):
    folder = write_qwen_image_wide(tmp_path / "qwen", heads=2, axes=(4, 4, 4))
    # True CFG runs only with a negative prompt: --cfg-parallel needs one.
    _matches_one_process(folder, [QWEN_REQUEST], [{"guidance_scale": 1.0}, {"negative_prompt": ""}])
