"""Helios extend_from: extending a finished video by a chunk is HeliosPipeline's video-to-video run on the source's
latents (`image_latents` its first latent frame, `video_latents` its chunks; nothing re-encoded), new frames only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.helios_checkpoints import TINY_A, write_tiny_helios
from tests.helpers.reference_pipelines import reference_pipeline
from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest, Task
from vidloom.core.session import VideoSession
from vidloom.generator import VideoGenerator
from vidloom.media.frames import to_uint8

pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning"),
              pytest.mark.usefixtures("one_torch_thread")]
FRAME_TOLERANCE = 1 / 255  # float32 on the CPU: one uint8 level, as the base parity tests
SIZE = dict(height=32, width=48)
SOURCE = dict(prompt="a paper boat drifting down a rainy street", num_inference_steps=2, guidance_scale=3.0, seed=5)
EXTEND = dict(prompt="the boat sails into a harbour at night", num_inference_steps=2, guidance_scale=3.0, seed=8)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from diffusers import HeliosPipeline

    folder = write_tiny_helios(tmp_path_factory.mktemp("helios-extend"), TINY_A)
    return reference_pipeline(HeliosPipeline, folder), VideoGenerator.from_pretrained(folder, device="cpu")


@pytest.fixture(scope="module")
def source(pair):
    """A two-chunk video to extend (the refusal checks reuse it)."""
    return pair[1].generate(num_frames=65, **SOURCE, **SIZE)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator("cpu").manual_seed(seed)


def test_extension_is_the_pipelines_video_to_video_on_the_source_latents(pair, source):
    pipe, gen = pair
    assert isinstance(source.session, VideoSession) and source.session.partition == (9, 9)

    # The reference: the same two chunks as latents, then V2V on them (the prefix noised once, by the video path).
    latents = pipe(prompt=SOURCE["prompt"], num_frames=66, num_inference_steps=2, guidance_scale=3.0,
                   output_type="latent", generator=_generator(SOURCE["seed"]), **SIZE).frames
    assert torch.allclose(latents, source.session.latents, atol=1e-4)
    theirs = pipe(prompt=EXTEND["prompt"], image_latents=latents[:, :, :1], video_latents=latents,
                  add_noise_to_image_latents=False, num_frames=33, num_inference_steps=2, guidance_scale=3.0,
                  generator=_generator(EXTEND["seed"]), output_type="np", **SIZE).frames[0]

    request = GenerationRequest(task=Task.T2V, num_frames=33, options={"extend_from": source}, **EXTEND)
    ours = gen.engine.run(request)["video"]
    assert ours.shape == theirs.shape == (33, 32, 48, 3)
    diff = np.abs(ours - theirs).max()
    assert diff <= FRAME_TOLERANCE, diff
    extended = gen.generate(extend_from=source, num_frames=33, **EXTEND)
    assert extended.metadata["task"] == "v2v" and np.array_equal(extended.frames, to_uint8(ours))
    # It continues the source: not the same as a fresh text-to-video run of the new prompt.
    fresh = gen.generate(num_frames=33, **EXTEND, **SIZE)
    assert np.abs(fresh.frames.astype(int) - extended.frames.astype(int)).max() > 10
    # The extension is itself extendable: its session holds its own new chunk.
    assert extended.session is not None and extended.session.partition == (9,)


def test_extension_keeps_the_source_size_and_refuses_other_inputs(pair, source):
    _, gen = pair
    with pytest.raises(InvalidRequest) as err:
        gen.generate(extend_from=source, num_frames=33, height=64, **{**EXTEND, "num_inference_steps": 1})
    assert err.value.field == "height"
    with pytest.raises(InvalidRequest) as err:
        gen.generate(extend_from=source.frames, num_frames=33, **EXTEND)
    assert err.value.field == "extend_from"
