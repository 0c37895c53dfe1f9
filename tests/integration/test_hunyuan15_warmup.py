"""HunyuanVideo-1.5's warmup_shapes: the load runs one short request per shape (text to video; image to video with a
gray first frame of the shape, whose aspect bucket is the size), and a request after the warm-up gives the frames it
gives without one, bit for bit (nothing the warm-up leaves behind, prompt cache or allocator, reaches a result)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.helpers.hunyuan15_checkpoints import write_i2v_pipeline, write_pipeline
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator
from vidloom.runtime.engine import EngineDriver

IMAGE = Image.fromarray(np.random.default_rng(1).integers(0, 256, (80, 45, 3), dtype=np.uint8))
CASES = {
    "t2v": (lambda d: write_pipeline(d, "p1"), (32, 48, 5), dict(height=32, width=48)),
    # 80 x 45 frames fall in the 80 x 48 bucket (patch 2 needs an even latent grid).
    "i2v": (lambda d: write_i2v_pipeline(d, "p2"), (80, 45, 5), dict(image=IMAGE)),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_warmed_load_gives_the_frames_of_a_cold_one(kind, tmp_path, monkeypatch):
    writer, shape, size = CASES[kind]
    writer(tmp_path)
    request = dict(negative_prompt="blurry", num_frames=5, num_inference_steps=2, seed=3, **size)
    cold = VideoGenerator.from_pretrained(tmp_path, device="cpu").generate("a red fox jumps", **request).frames
    warmups: list[GenerationRequest] = []
    real_run = EngineDriver.run
    monkeypatch.setattr(EngineDriver, "run", lambda self, work, *a, **k: warmups.append(work) or
                        real_run(self, work, *a, **k))
    warmed = VideoGenerator.from_pretrained(tmp_path, device="cpu", deploy=DeployConfig(warmup_shapes=(shape,)))
    monkeypatch.undo()
    (warmup,) = warmups
    assert warmup.task is (Task.I2V if kind == "i2v" else Task.T2V) and warmup.num_frames == shape[2]
    if kind == "i2v":
        assert np.asarray(warmup.image).shape == (*shape[:2], 3)
    assert np.array_equal(warmed.generate("a red fox jumps", **request).frames, cold)
