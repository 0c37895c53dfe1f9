"""Continuation sessions on CUDA in bfloat16: a resident session and a rebuilt one give the same frames."""

from __future__ import annotations

import numpy as np
import torch

from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator


def test_resident_and_rebuilt_extensions_match_in_bf16(tmp_path):
    far = VideoGenerator.from_pretrained(write_tiny_far(tmp_path, FAR_A), device="cuda", dtype="bfloat16",
                                         deploy=DeployConfig(kv_session_ttl_s=600))
    source = far.generate("a red fox runs over snow", height=32, width=48, num_frames=9, num_inference_steps=2, seed=1)
    extend = dict(prompt="a cat walks on the ice", extend_from=source, num_frames=21, num_inference_steps=2, seed=2)
    resident = far.engine.run(GenerationRequest(**extend))
    assert resident["session"]["resumed"] == "resident"
    far.engine.caches.release_session(source.session.session_id)
    rebuilt = far.engine.run(GenerationRequest(**extend))
    assert rebuilt["session"]["resumed"] == "rebuilt"
    # bf16 latents round-trip exactly through the float32 session; the KV then comes from the same kernels.
    np.testing.assert_allclose(resident["video"], rebuilt["video"], atol=1e-5, rtol=0)
    for session_id in far.engine.caches.session_ids():
        far.engine.caches.release_session(session_id)
    assert far.engine.caches.bytes_in_use == 0
    torch.cuda.synchronize()
