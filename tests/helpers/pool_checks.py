"""What every pool-versus-one-process test checks on a started pool."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vidloom.core.errors import InvalidRequest
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator


def check_pool_video(gen: VideoGenerator, plan: ParallelPlan, request: GenerationRequest, expected: np.ndarray,
                     tolerance: float, label: str) -> None:
    """The pool's video for `request` equals one process's `expected` within `tolerance`; under --cfg-parallel the
    same request without guidance is refused at submit, naming guidance_scale."""
    out = gen.engine.run(request)["video"]
    assert out.shape == expected.shape
    diff = float(np.abs(out - expected).max())
    print(f"{label} {plan.describe()}: max abs diff {diff:.1e} on frames (std {expected.std():.2f})")
    assert diff <= tolerance, diff
    if plan.cfg > 1:
        with pytest.raises(InvalidRequest) as err:
            gen.engine.submit(dataclasses.replace(request, guidance_scale=1.0))
        assert err.value.field == "guidance_scale"
