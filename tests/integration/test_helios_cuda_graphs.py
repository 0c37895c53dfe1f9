"""What a CUDA graph of a Helios step may hold, seen on CPU through the stand-in capturer
(tests/helpers/graph_capturer.py); the per-chunk replays against the plain run are in test_cuda_graph_families.py.

The captured body is the one a replay runs: the guidance scale a 0-dim float32 static buffer, the chunk's history
latents and frame indices static buffers. Helios-Mid's CFG-Zero* combine used to read the scale back to the host
(`float(guidance_scale)`, an `aten._local_scalar_dense` under capture); no op of the body may do that now.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.graph_capturer import UNCAPTURABLE, RecordingCapturer, graphed_generator
from tests.helpers.helios_checkpoints import PYRAMID_A, write_tiny_helios_pyramid
from vidloom.generator import VideoGenerator

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
# One chunk of the three-stage pyramid, one step per stage; 64 x 64 is the smallest grid (1 x 1 tokens at stage 1).
REQUEST = dict(height=64, width=64, num_frames=5, num_inference_steps=3, seed=4, guidance_scale=4.5,
               negative_prompt="blurry")


def test_a_helios_mid_step_holds_no_op_a_cuda_graph_cannot(tmp_path):
    plain = VideoGenerator.from_pretrained(write_tiny_helios_pyramid(tmp_path / "mid", PYRAMID_A), device="cpu")
    ops: set[str] = set()
    graphed = graphed_generator(plain, RecordingCapturer(ops=ops))
    got = graphed.generate("a red fox jumps", **REQUEST).frames
    assert np.array_equal(got, plain.generate("a red fox jumps", **REQUEST).frames)
    assert graphed.engine.graph_stats == {"captures": 3, "replays": 3, "fallbacks": 0}  # a graph per stage
    assert "aten.scaled_dot_product_attention.default" in ops  # the whole step was seen
    assert not ops & UNCAPTURABLE, sorted(ops & UNCAPTURABLE)
