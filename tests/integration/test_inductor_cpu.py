"""--compile with inductor on CPU (C++ codegen): Wan2.1 and Flux2 Klein demos, one tiny shape each.

The compiled output matches the eager one, and the recompiles are bounded by the shape buckets: a
request of the warmed shape compiles nothing new, one outside the buckets runs eagerly, is counted
as a miss and compiles nothing either. Inductor needs a C++ compiler on CPU (.ci/run installs g++).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from vidloom.core.deploy import DeployConfig
from vidloom.generator import VideoGenerator

pytestmark = [
    pytest.mark.slow,  # a first inductor compile of a tiny DiT takes 30-90 s here (cached afterwards)
    pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                       reason="inductor's CPU backend needs a C++ compiler (apt-get install g++)"),
]

# family demo -> (warmed shape (height, width, frames), another shape, request options)
CASES = {
    "wan2.1-demo": ((64, 64, 5), (64, 96, 5), {"num_inference_steps": 2}),
    "flux2-klein-demo": ((64, 64, 1), (64, 96, 1), {}),
}


def _graphs() -> int:
    import torch._dynamo.utils

    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@pytest.mark.parametrize("demo", list(CASES))
def test_inductor_on_cpu_matches_eager_and_bounds_recompiles(demo, tmp_path: Path):
    warm, other, options = CASES[demo]
    deploy = DeployConfig(compile=True, compile_backend="inductor", warmup_shapes=(warm,))
    compiled = VideoGenerator.from_pretrained(demo, device="cpu", cache_dir=tmp_path, deploy=deploy)
    buckets = compiled.engine.compile_buckets
    after_warmup = _graphs()
    assert buckets.compiled_shapes == 1 and after_warmup >= 1  # the warmup compiled the declared shape

    size = {"height": warm[0], "width": warm[1], **({"num_frames": warm[2]} if warm[2] > 1 else {})}
    ours = compiled.generate("a red fox", seed=3, **size, **options).frames
    assert _graphs() == after_warmup and buckets.misses == 0  # the warmed shape reuses its graphs

    eager = VideoGenerator.from_pretrained(demo, device="cpu", cache_dir=tmp_path)
    reference = eager.generate("a red fox", seed=3, **size, **options).frames
    # Inductor fuses and reorders float32 reductions: frames may differ by a rounding step in uint8.
    assert np.abs(ours.astype(np.int16) - reference.astype(np.int16)).max() <= 2

    other_size = {"height": other[0], "width": other[1], **({"num_frames": other[2]} if other[2] > 1 else {})}
    compiled.generate("a red fox", seed=3, **other_size, **options)
    assert buckets.misses == 1 and _graphs() == after_warmup  # outside the buckets: eager, no recompile
