"""Helios-Distilled parity: vidloom's native DMD pyramid loop vs diffusers' HeliosPyramidPipeline with
is_distilled and a HeliosDMDScheduler, same folder, seed and prompt, on two tiny random configs (3 stages, gamma
1/3, dynamic linear shift, amplified first chunk / 2 stages over a shifted train range, gamma 0.25, static shift,
not amplified), each with its own transformer switches and VAE; text to video over two chunks and image to video."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.helios_checkpoints import DISTILLED_CONFIGS, float64_block_factor, pyramid_pair
from vidloom.core.output import ProgressEvent
from vidloom.core.request import GenerationRequest, Task
from vidloom.families.helios.loop import STEP
from vidloom.families.helios.options import AMPLIFY_FIRST_CHUNK
from vidloom.families.helios.pyramid import split_steps

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
# float32 on CPU; the bound is one uint8 level of [0, 1] frames. Measured: at most 3.7e-6 over both configs, T2V
# (two chunks), I2V and V2V.
FRAME_TOLERANCE = 1 / 255
PROMPT = "a paper boat drifting down a rainy street"
STEPS = 5  # split 2 + 2 + 1 (3 stages) or 3 + 2 (2 stages); amplified, the first chunk runs 4 + 4 + 2
MEDIA_SEED = 9  # the image and video runs share one seed, so one text-only run shows the media reached the video


@pytest.fixture(scope="module", params=DISTILLED_CONFIGS, ids=[c.name for c in DISTILLED_CONFIGS])
def pair(request, tmp_path_factory):
    return pyramid_pair(request.param, tmp_path_factory.mktemp(request.param.name))


def _theirs(monkeypatch, spec, pipe, frames: int, seed: int, **media) -> np.ndarray:
    height, width = spec.size
    stages = split_steps(STEPS, spec.scheduler["stages"])
    with monkeypatch.context() as patch:  # the reference call only
        float64_block_factor(patch, pipe)
        out = pipe(prompt=PROMPT, num_frames=frames, guidance_scale=1.0, height=height, width=width,
                   pyramid_num_inference_steps_list=list(stages), is_amplify_first_chunk=spec.amplify,
                   generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **media)
    return np.asarray(out.frames[0], dtype=np.float32)


def _ours(spec, gen, frames: int, seed: int, task: Task = Task.T2V, amplify: bool | None = None,
          events: list | None = None, **media) -> np.ndarray:
    height, width = spec.size
    amplify = spec.amplify if amplify is None else amplify
    request = GenerationRequest(prompt=PROMPT, task=task, num_frames=frames, num_inference_steps=STEPS, seed=seed,
                                guidance_scale=1.0, height=height, width=width,
                                options={AMPLIFY_FIRST_CHUNK: True} if amplify else {}, **media)
    return gen.engine.run(request, on_event=None if events is None else events.append)["video"]


@pytest.fixture(scope="module")
def text_only(pair) -> np.ndarray:
    """Ours, text to video at MEDIA_SEED: what the image and video runs must differ from."""
    spec, _, gen = pair
    return _ours(spec, gen, 33, seed=MEDIA_SEED)


def test_two_chunks_match_pipeline(pair, monkeypatch):
    spec, pipe, gen = pair
    theirs = _theirs(monkeypatch, spec, pipe, 66, seed=5)
    events: list = []
    ours = _ours(spec, gen, 65, seed=5, events=events)
    assert ours.shape == theirs.shape == (65, *spec.size, 3)
    diff = np.abs(ours - theirs).max()
    assert diff <= FRAME_TOLERANCE, diff
    assert np.abs(theirs[33:] - theirs[:32]).max() > 0.05  # the second chunk is its own
    # Progress counts every step of both chunks, the amplified first one's twice.
    steps = [(e.step, e.total) for e in events if isinstance(e, ProgressEvent) and e.phase == STEP]
    total = (2 if spec.amplify else 1) * STEPS + STEPS
    assert steps == [(k, total) for k in range(1, total + 1)]
    # The amplified first chunk is its own run; the second chunk, on other history, differs too.
    assert np.abs(_ours(spec, gen, 33, seed=5, amplify=not spec.amplify) - ours[:33]).max() > 0.05


def test_image_to_video_matches_pipeline(pair, text_only, monkeypatch):
    from tests.helpers.wan_i2v_checkpoints import make_image

    spec, pipe, gen = pair
    image = make_image(40, 60, 2)
    theirs = _theirs(monkeypatch, spec, pipe, 33, seed=MEDIA_SEED, image=image)
    ours = _ours(spec, gen, 33, seed=MEDIA_SEED, task=Task.I2V, image=[image])
    assert ours.shape == theirs.shape == (33, *spec.size, 3)
    diff = np.abs(ours - theirs).max()
    assert diff <= FRAME_TOLERANCE, diff
    assert np.abs(text_only - ours).max() > 0.05  # the image reached the video


def test_video_to_video_matches_pipeline(pair, text_only, monkeypatch):
    """A 37-frame clip continued: its first frame the prefix, its last 33 frames the history."""
    from tests.helpers.wan_i2v_checkpoints import make_image

    spec, pipe, gen = pair
    height, width = spec.size
    clip = [make_image(width, height, seed) for seed in range(37)]
    theirs = _theirs(monkeypatch, spec, pipe, 33, seed=MEDIA_SEED, video=clip)
    ours = _ours(spec, gen, 33, seed=MEDIA_SEED, task=Task.V2V, video=clip)
    assert ours.shape == theirs.shape == (33, *spec.size, 3)
    diff = np.abs(ours - theirs).max()
    assert diff <= FRAME_TOLERANCE, diff
    assert np.abs(text_only - ours).max() > 0.05  # the clip reached the video
