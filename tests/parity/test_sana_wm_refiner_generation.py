"""SANA-WM two-stage parity: vidloom with --two-stage vs diffusers' SanaWMPipeline (stage 1, latents out)
followed by SanaWMLTX2Refiner (its defaults: sink 1, chunks of 3 latent frames, an 11-frame window, the
distilled 3-step sigmas) decoding through the same LTX-2 VAE. The refiner's generator is seeded with the
request's seed on both sides. Same folder, fp32 on CPU. Bound 1e-4 in [0, 1] (stage 1 alone is within
5e-5, see test_sana_wm_generation.py), well under one uint8 level; the refiner moves frames by > 1e-2.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.sana_wm_checkpoints import CONFIGS, write_tiny_refiner, write_tiny_sana_wm
from tests.helpers.reference_pipelines import reference_pipeline
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator

FRAME_TOLERANCE = 1e-4
PROMPT = "a car driving across a vast desert plain"
# 41 frames -> 6 latent frames: the sink, then chunks [1, 4) and [4, 6) (a short last chunk).
BASE = dict(height=64, width=96, num_frames=41, num_inference_steps=2, seed=3, fps=16)
INTRINSICS = [50.0, 52.0, 35.0, 20.0]
IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 70, 3), dtype=np.uint8))


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda s: s.name)
def folder(request, tmp_path_factory):
    folder = write_tiny_sana_wm(tmp_path_factory.mktemp(request.param.name), request.param)
    write_tiny_refiner(folder, request.param)
    return folder


@pytest.fixture(scope="module")
def reference(folder):
    from diffusers import SanaWMLTX2Refiner, SanaWMPipeline

    pipe = reference_pipeline(SanaWMPipeline, folder)
    refiner = SanaWMLTX2Refiner.from_pretrained(str(folder / "refiner"), dtype=torch.float32, vae=pipe.vae)
    refiner.set_progress_bar_config(disable=True)
    return pipe, refiner


@pytest.fixture(scope="module")
def generator(folder):
    return VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(two_stage=True))


def _reference(reference, guidance: float, **kw) -> np.ndarray:
    pipe, refiner = reference
    latents = pipe(image=IMAGE, prompt=PROMPT, negative_prompt="", intrinsics=kw.pop("intrinsics", INTRINSICS),
                   height=BASE["height"], width=BASE["width"], num_frames=kw.pop("num_frames", BASE["num_frames"]),
                   num_inference_steps=BASE["num_inference_steps"], guidance_scale=guidance,
                   generator=torch.Generator().manual_seed(BASE["seed"]), output_type="latent", **kw).frames
    return refiner(latents, PROMPT, fps=float(BASE["fps"]), generator=torch.Generator().manual_seed(BASE["seed"]),
                   output_type="np")


def _ours(gen: VideoGenerator, **kw) -> np.ndarray:
    fields = {**BASE, "negative_prompt": "", "image": IMAGE, "intrinsics": INTRINSICS, **kw}
    return gen.engine.run(GenerationRequest(prompt=PROMPT, **fields))["video"]


def test_action_string_matches_pipeline_and_refiner(reference, generator):
    frames = _reference(reference, 4.0, action="w-16,jw-16,ik-8")
    ours = _ours(generator, camera="w-16,jw-16,ik-8", guidance_scale=4.0)
    assert ours.shape == frames.shape == (40, 64, 96, 3)  # the refiner drops the sink's decoded frame
    assert np.abs(ours - frames).max() < FRAME_TOLERANCE
    pipe = reference[0]
    stage1 = pipe(image=IMAGE, prompt=PROMPT, negative_prompt="", intrinsics=INTRINSICS, action="w-16,jw-16,ik-8",
                  height=BASE["height"], width=BASE["width"], num_frames=BASE["num_frames"],
                  num_inference_steps=BASE["num_inference_steps"], guidance_scale=4.0,
                  generator=torch.Generator().manual_seed(BASE["seed"]), output_type="np").frames
    assert np.abs(ours - stage1[1:]).max() > 1e-2  # the refiner is not a no-op


def test_explicit_c2w_matches_pipeline_and_refiner(reference, generator, folder):
    if folder.parent.name.startswith(CONFIGS[1].name):
        pytest.skip("covered on the first config; the second runs the action-string parity")
    from diffusers.pipelines.sana_wm.cam_utils import action_string_to_c2w

    poses = action_string_to_c2w("dl-20,s-22")  # 43 poses: 41 frames are kept
    poses[:, :3, 3] *= 3.0
    frames = _reference(reference, 1.0, c2w=poses)
    ours = _ours(generator, c2w=poses, guidance_scale=1.0)
    assert ours.shape == frames.shape
    assert np.abs(ours - frames).max() < FRAME_TOLERANCE


def test_a_video_past_the_refiners_kv_window_matches_the_refiner(reference, generator, folder):
    """113 frames -> 15 latent frames, past the refiner's 11-frame window: its history is trimmed (the sink's
    rotary slides) from the fourth chunk on, which 41 frames never reach. A window one frame short moves this
    output by ~1e-3 here (#40)."""
    if folder.name.startswith(CONFIGS[1].name):
        pytest.skip("covered on the first config")
    frames = _reference(reference, 1.0, action="w-60,jw-60", num_frames=113)
    ours = _ours(generator, camera="w-60,jw-60", guidance_scale=1.0, num_frames=113)
    assert ours.shape == frames.shape == (112, 64, 96, 3)
    assert np.abs(ours - frames).max() < FRAME_TOLERANCE
