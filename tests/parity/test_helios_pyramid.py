"""Helios pyramid parity: vidloom's native pyramid loop vs diffusers' HeliosPyramidPipeline, same folder, seed and
prompt, on two tiny random configs (3 stages, UniPC, dynamic shift, gamma 1/3, CFG-Zero* / 2 stages over a shifted
train range, Euler, gamma 0.25, plain CFG), each with its own transformer switches and VAE."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.helios_checkpoints import PYRAMID_CONFIGS, float64_block_factor, pyramid_pair
from vidloom.core.request import GenerationRequest, Task
from vidloom.families.helios.pyramid import split_steps

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
# float32 on CPU; the bound is one uint8 level of [0, 1] frames. Measured: at most 7.3e-6 over both configs, T2V
# (two chunks, with and without CFG), I2V and V2V (6.6e-6).
FRAME_TOLERANCE = 1 / 255
PROMPT = "a paper boat drifting down a rainy street"
STEPS = 5  # split 2 + 2 + 1 (3 stages) or 3 + 2 (2 stages): uneven, and CFG-Zero*'s two zeroed steps plus one
MEDIA_SEED = 9  # the image and video runs share one seed, so one text-only run shows the media reached the video


@pytest.fixture(scope="module", params=PYRAMID_CONFIGS, ids=[c.name for c in PYRAMID_CONFIGS])
def pair(request, tmp_path_factory):
    return pyramid_pair(request.param, tmp_path_factory.mktemp(request.param.name))


def _theirs(monkeypatch, spec, pipe, frames: int, scale: float, seed: int, **media) -> np.ndarray:
    height, width = spec.size
    stages = split_steps(STEPS, spec.scheduler["stages"])
    with monkeypatch.context() as patch:  # the reference call only
        float64_block_factor(patch, pipe)
        out = pipe(prompt=PROMPT, num_frames=frames, guidance_scale=scale, height=height, width=width,
                   pyramid_num_inference_steps_list=list(stages),
                   generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **media)
    return np.asarray(out.frames[0], dtype=np.float32)


def _ours(spec, gen, frames: int, scale: float, seed: int, task: Task = Task.T2V, **media) -> np.ndarray:
    height, width = spec.size
    request = GenerationRequest(prompt=PROMPT, task=task, num_frames=frames, num_inference_steps=STEPS, seed=seed,
                                guidance_scale=scale, height=height, width=width, **media)
    return gen.engine.run(request)["video"]


@pytest.fixture(scope="module")
def text_only(pair) -> np.ndarray:
    """Ours, text to video at MEDIA_SEED: what the image and video runs must differ from."""
    spec, _, gen = pair
    return _ours(spec, gen, 33, 3.0, seed=MEDIA_SEED)


@pytest.mark.parametrize("scale", [1.0, 4.0], ids=["no-cfg", "cfg"])
def test_two_chunks_match_pipeline(pair, monkeypatch, scale):
    spec, pipe, gen = pair
    theirs = _theirs(monkeypatch, spec, pipe, 66, scale, seed=5)
    ours = _ours(spec, gen, 65, scale, seed=5)
    assert ours.shape == theirs.shape == (65, *spec.size, 3)
    diff = np.abs(ours - theirs).max()
    assert diff <= FRAME_TOLERANCE, diff
    assert np.abs(theirs[33:] - theirs[:32]).max() > 0.05  # the second chunk is its own


def test_image_to_video_matches_pipeline(pair, text_only, monkeypatch):
    from tests.helpers.wan_i2v_checkpoints import make_image

    spec, pipe, gen = pair
    image = make_image(40, 60, 2)
    theirs = _theirs(monkeypatch, spec, pipe, 33, 3.0, seed=MEDIA_SEED, image=image)
    ours = _ours(spec, gen, 33, 3.0, seed=MEDIA_SEED, task=Task.I2V, image=[image])
    assert ours.shape == theirs.shape == (33, *spec.size, 3)
    diff = np.abs(ours - theirs).max()
    assert diff <= FRAME_TOLERANCE, diff
    assert np.abs(text_only - ours).max() > 0.05  # the image reached the video


def test_video_to_video_matches_pipeline(pair, text_only, monkeypatch):
    """A 37-frame clip: its first frame is the prefix, its last 33 frames (noised per latent frame) the history;
    the new chunk continues it through the stages."""
    from tests.helpers.wan_i2v_checkpoints import make_image

    spec, pipe, gen = pair
    height, width = spec.size
    clip = [make_image(width, height, seed) for seed in range(37)]
    theirs = _theirs(monkeypatch, spec, pipe, 33, 3.0, seed=MEDIA_SEED, video=clip)
    ours = _ours(spec, gen, 33, 3.0, seed=MEDIA_SEED, task=Task.V2V, video=clip)
    assert ours.shape == theirs.shape == (33, *spec.size, 3)
    diff = np.abs(ours - theirs).max()
    assert diff <= FRAME_TOLERANCE, diff
    assert np.abs(text_only - ours).max() > 0.05  # the clip reached the video
