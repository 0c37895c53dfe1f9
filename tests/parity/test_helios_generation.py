"""Helios parity: vidloom's native family vs diffusers' HeliosPipeline, same folder, seed and prompt, on two tiny
random configs (UniPC with the dynamic time shift / Euler without; different transformer switches and VAE)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.helios_checkpoints import CONFIGS, TINY_A, write_tiny_helios
from tests.helpers.reference_pipelines import reference_pipeline
from vidloom.core.output import ChunkEvent, ProgressEvent
from vidloom.core.request import GenerationRequest, Task
from vidloom.families.helios.loop import CHUNK_PHASE, STEP
from vidloom.media.frames import to_uint8
from vidloom.generator import VideoGenerator

pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning"),
              pytest.mark.usefixtures("one_torch_thread")]
# float32 on CPU; the acceptance bound is one uint8 level (1/255) of [0, 1] frames. Measured: at most 4.6e-6 over
# both configs, with and without CFG (a few float32 ulps through two chunks of UniPC or Euler and the VAE).
FRAME_TOLERANCE = 1 / 255
PROMPT = "a paper boat drifting down a rainy street"
SIZE = dict(height=32, width=48)  # non-square; history patches pad 4x6 latents to the 2x / 4x grids


@pytest.fixture(scope="module", params=CONFIGS, ids=[c.name for c in CONFIGS])
def pair(request, tmp_path_factory):
    from diffusers import HeliosPipeline

    folder = write_tiny_helios(tmp_path_factory.mktemp(request.param.name), request.param)
    return reference_pipeline(HeliosPipeline, folder), VideoGenerator.from_pretrained(folder, device="cpu")


def _ours(gen: VideoGenerator, frames: int, steps: int, scale: float, seed: int,
          events: list | None = None) -> np.ndarray:
    request = GenerationRequest(prompt=PROMPT, task=Task.T2V, num_frames=frames, num_inference_steps=steps, seed=seed,
                                guidance_scale=scale, **SIZE)
    return gen.engine.run(request, on_event=None if events is None else events.append)["video"]


def _theirs(pipe, frames: int, steps: int, scale: float, seed: int) -> np.ndarray:
    out = pipe(prompt=PROMPT, num_frames=frames, num_inference_steps=steps, guidance_scale=scale,
               generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **SIZE)
    return np.asarray(out.frames[0], dtype=np.float32)


@pytest.mark.parametrize("scale", [1.0, 4.0], ids=["no-cfg", "cfg"])
def test_two_chunks_match_pipeline(pair, scale):
    """66 frames asked of the pipeline: two chunks, cut to 65; we are asked 65 and return the same frames."""
    pipe, gen = pair
    theirs = _theirs(pipe, 66, 3, scale, seed=5)
    events: list = []
    ours = _ours(gen, 65, 3, scale, seed=5, events=events)
    assert ours.shape == theirs.shape == (65, 32, 48, 3)
    diff = np.abs(ours - theirs).max()
    assert diff <= FRAME_TOLERANCE, diff
    # The second chunk is not a copy of the first: the history and new noise reach it.
    assert np.abs(theirs[33:] - theirs[:32]).max() > 0.05

    # Each chunk streams right after its own steps, before the next chunk's first step; in order, the chunks are
    # the video (the last one cut to the asked length).
    kinds = ["chunk" if isinstance(e, ChunkEvent) else e.phase for e in events
             if isinstance(e, ChunkEvent) or (isinstance(e, ProgressEvent) and e.phase == STEP)]
    assert kinds == (["denoise"] * 3 + ["chunk"]) * 2
    streamed = [e.chunk for e in events if isinstance(e, ChunkEvent)]
    assert [(c.index, c.total, c.start_frame, c.stop_frame) for c in streamed] == [(0, 2, 0, 33), (1, 2, 33, 65)]
    assert np.array_equal(np.concatenate([c.frames for c in streamed]), to_uint8(ours))
    chunks = [e.step for e in events if isinstance(e, ProgressEvent) and e.phase == CHUNK_PHASE]
    assert chunks == [1, 2]


def test_image_to_video_matches_pipeline(pair):
    """The image's VAE posterior sample (prefix) and its 33-frame still's last latent (newest history), each noised,
    drawn from the seed's generator before the chunks' noise, in the pipeline's order."""
    from tests.helpers.wan_i2v_checkpoints import make_image

    pipe, gen = pair
    image = make_image(40, 60, 2)  # another size than the video's: resized as the pipeline resizes it
    out = pipe(prompt=PROMPT, image=image, num_frames=33, num_inference_steps=2, guidance_scale=3.0,
               generator=torch.Generator("cpu").manual_seed(9), output_type="np", **SIZE)
    theirs = np.asarray(out.frames[0], dtype=np.float32)
    request = GenerationRequest(prompt=PROMPT, task=Task.I2V, image=[image], num_frames=33, num_inference_steps=2,
                                seed=9, guidance_scale=3.0, **SIZE)
    ours = gen.engine.run(request)["video"]
    assert ours.shape == theirs.shape == (33, 32, 48, 3)
    diff = np.abs(ours - theirs).max()
    assert diff <= FRAME_TOLERANCE, diff
    t2v = _ours(gen, 33, 2, 3.0, seed=9)
    assert np.abs(t2v - ours).max() > 0.05  # the image reached the video


def test_video_to_video_matches_pipeline(pair):
    """A 37-frame clip: its first frame is the prefix and its last 33 frames (one whole chunk, encoded and noised per
    latent frame) the history; the new chunk continues it. Drawn from the generator in the pipeline's order."""
    from tests.helpers.wan_i2v_checkpoints import make_image

    pipe, gen = pair
    clip = [make_image(48, 32, seed) for seed in range(37)]
    out = pipe(prompt=PROMPT, video=clip, num_frames=33, num_inference_steps=2, guidance_scale=3.0,
               generator=torch.Generator("cpu").manual_seed(4), output_type="np", **SIZE)
    theirs = np.asarray(out.frames[0], dtype=np.float32)
    request = GenerationRequest(prompt=PROMPT, task=Task.V2V, video=clip, num_frames=33, num_inference_steps=2,
                                seed=4, guidance_scale=3.0, **SIZE)
    ours = gen.engine.run(request)["video"]
    assert ours.shape == theirs.shape == (33, 32, 48, 3)
    diff = np.abs(ours - theirs).max()
    assert diff <= FRAME_TOLERANCE, diff


# The tiled decode is the same code for both configs' VAEs (they differ in widths and depth, which the untiled tests
# cover), so it runs on one: diffusers' tiled_decode calls the decoder once per tile and latent frame, the costliest
# call of this file.
@pytest.mark.parametrize("pair", [TINY_A], ids=[TINY_A.name], indirect=True)
def test_vae_tile_decodes_each_chunk_in_tiles_as_the_pipeline(pair, tmp_path):
    """vae_tile 32 every 24 px = diffusers' AutoencoderKLWan.enable_tiling(32, 32, 24, 24): each chunk's 4 x 6 latent
    decodes in 2 x 2 tiles (the second row and column narrower) blended over 8 px across both seams in both, and
    the seams make the frames differ from the untiled ones. Two chunks, so the tiled decode runs once per chunk.
    Measured (unipc config): 4.1e-6 from the tiled pipeline at 16 px strides (3 x 2 tiles), 0.91 from our
    untiled frames; the bound is FRAME_TOLERANCE (one uint8 level)."""
    from vidloom.core.deploy import DeployConfig

    pipe, gen = pair
    tiled = VideoGenerator.from_pretrained(gen.engine.instance.card.source, device="cpu",
                                           deploy=DeployConfig(vae_tile=32, vae_tile_stride=24))
    pipe.vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24,
                           tile_sample_stride_width=24)
    try:
        theirs = _theirs(pipe, 66, 2, 4.0, seed=6)
    finally:
        pipe.vae.disable_tiling()
    ours = _ours(tiled, 65, 2, 4.0, seed=6)
    assert ours.shape == theirs.shape == (65, 32, 48, 3)
    diff = np.abs(ours - theirs).max()
    untiled = _ours(gen, 65, 2, 4.0, seed=6)
    print(f"vae_tile vs the tiled pipeline: {diff:.3g}; vs our untiled frames: {np.abs(untiled - ours).max():.3g}")
    assert diff <= FRAME_TOLERANCE, diff
    assert np.abs(untiled - ours).max() > 0.01  # the tiles really ran (same latents, other seams)
