"""Cosmos3 generation on CUDA (skipped without it): fp32 frames match the CPU run; bf16 runs with its prefix
buffers in bf16 on the device and returns them to the cache manager."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator

KW = dict(prompt="a fox in the snow", num_frames=5, height=32, width=32, num_inference_steps=3, guidance_scale=3.0,
          seed=2)


@pytest.fixture
def no_tf32():
    # cuDNN runs float32 Conv3d in TF32 by default (10-bit mantissa: 0.9-1.9e-3 off on the VAE here), which
    # is not the float32 this test means; matmuls likewise where allowed. Restored after the test.
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_cuda_generation_matches_cpu(cosmos3_dir: Path, no_tf32):
    cpu = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu", dtype="float32").engine.run(GenerationRequest(**KW))["video"]
    gpu = VideoGenerator.from_pretrained(cosmos3_dir, device="cuda", dtype="float32")
    got = gpu.engine.run(GenerationRequest(**KW))["video"]
    assert np.abs(got - cpu).max() < 1e-3  # true fp32 on both (no TF32); CUDA kernels reorder sums


def test_cuda_bf16_generation_and_reasoning(cosmos3_dir: Path):
    gpu = VideoGenerator.from_pretrained(cosmos3_dir, device="cuda", dtype="bfloat16")
    baseline = gpu.engine.caches.bytes_in_use
    out = gpu.generate(reason=True, **KW)
    assert out.frames.shape == (5, 32, 32, 3) and out.metadata["reasoned_prompt"]
    assert gpu.engine.caches.bytes_in_use == baseline
