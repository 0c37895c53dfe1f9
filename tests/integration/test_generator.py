"""VideoGenerator on the built-in demo: outputs, progress, seeding, cancellation, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from vidloom.core.errors import Cancelled, CheckpointError, InvalidRequest, UnknownModel
from vidloom.core.output import ProgressEvent
from vidloom.generator import VideoGenerator
from vidloom.media.video import read_video
from vidloom.runtime.engine import CancellationToken

SMALL = dict(height=32, width=48, num_frames=5, num_inference_steps=3)


@pytest.fixture(scope="module")
def generator(demo_cache):
    return VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache)


def test_generate_returns_uint8_frames_and_metadata(generator):
    video = generator.generate("a dog runs in the park", seed=3, **SMALL)
    assert video.frames.dtype == np.uint8 and video.frames.shape == (5, 32, 48, 3)
    assert video.fps == generator.card.sampling_defaults.fps
    meta = video.metadata
    assert meta["model"] == "wan2.1-demo" and meta["seed"] == 3 and meta["num_inference_steps"] == 3
    assert meta["sampler"] == "unipc" and meta["elapsed_s"] >= 0


def test_save_writes_a_playable_mp4(generator, tmp_path):
    video = generator.generate("a dog runs in the park", seed=3, **SMALL)
    path = video.save(tmp_path / "out.mp4")
    frames, fps = read_video(path)
    assert frames.shape == video.frames.shape and fps == video.fps
    # H.264 at crf 18 is lossy; noise-like frames still come back close on average.
    assert np.abs(frames.astype(float) - video.frames.astype(float)).mean() < 20


def test_same_seed_same_video_different_seed_differs(generator):
    a = generator.generate("a fox", seed=1, **SMALL).frames
    b = generator.generate("a fox", seed=1, **SMALL).frames
    c = generator.generate("a fox", seed=2, **SMALL).frames
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_progress_events_cover_denoise_and_decode(generator):
    events = []
    generator.generate("a fox", seed=1, on_event=events.append, **SMALL)
    progress = [(e.phase, e.step, e.total) for e in events if isinstance(e, ProgressEvent)]
    assert [p for p in progress if p[0] == "denoise"] == [("denoise", i, 3) for i in (1, 2, 3)]
    assert [p for p in progress if p[0] == "decode"] == [("decode", i, 2) for i in (1, 2)]


@pytest.mark.parametrize("cancel_at", [1, 3])
def test_cancel_mid_denoise_stops_within_one_step_then_generator_still_works(generator, cancel_at):
    steps = 6
    token = CancellationToken()
    seen = []
    transformer = generator.engine.instance["transformer"]
    calls = []  # one entry per DiT forward: the real work done, not just the events reported
    hook = transformer.register_forward_hook(lambda *args: calls.append(1))

    def on_event(event):
        seen.append(event)
        if isinstance(event, ProgressEvent) and event.phase == "denoise" and event.step == cancel_at:
            token.cancel()

    try:
        with pytest.raises(Cancelled):
            generator.generate("a fox", seed=1, on_event=on_event, cancel=token, **{**SMALL, "num_inference_steps": steps})
    finally:
        hook.remove()
    denoised = [e.step for e in seen if isinstance(e, ProgressEvent) and e.phase == "denoise"]
    # The cancel lands at the next step boundary: at most one step after the one that reported it.
    assert cancel_at <= denoised[-1] <= cancel_at + 1 < steps
    assert denoised == list(range(1, denoised[-1] + 1))
    assert len(calls) == 2 * denoised[-1]  # CFG: cond + uncond forward per step, none after the stop
    assert not any(e.phase == "decode" for e in seen if isinstance(e, ProgressEvent))
    assert generator.generate("a fox", seed=1, **SMALL).num_frames == 5


def test_invalid_input_names_field_and_leaves_generator_working(generator):
    with pytest.raises(InvalidRequest, match="num_frames"):
        generator.generate("a fox", num_frames=6)
    with pytest.raises(InvalidRequest, match="sampler"):
        generator.generate("a fox", sampler="ddim")
    assert generator.generate("a fox", seed=1, **SMALL).num_frames == 5


@pytest.mark.parametrize(("field", "value"), [("flow_shift", 5e-324), ("flow_shift", 1e9), ("guidance_scale", 1e30),
                                             ("step_cache_threshold", float("inf"))])
def test_degenerate_numbers_are_refused_by_the_python_api(generator, field, value):
    # flow_shift 5e-324 used to run and fail with non-finite latents; now the call names the field first.
    with pytest.raises(InvalidRequest, match=field):
        generator.generate("a fox", **SMALL, **{field: value})


def test_unknown_model_lists_known_ids():
    with pytest.raises(UnknownModel, match="wan2.1-demo"):
        VideoGenerator.from_pretrained("no-such-model")


def test_registered_real_model_without_weights_says_how(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="hf download Wan-AI/Wan2.1-T2V-1.3B-Diffusers"):
        VideoGenerator.from_pretrained("wan2.1-t2v-1.3b", device="cpu")


def test_generate_stream_gives_a_non_causal_video_as_one_chunk(generator):
    import numpy as np

    kw = dict(height=32, width=32, num_frames=5, num_inference_steps=2, seed=4)
    chunks = list(generator.generate_stream("a cat", **kw))
    assert len(chunks) == 1 and chunks[0].chunk.total == 1
    assert np.array_equal(chunks[0].chunk.frames, generator.generate("a cat", **kw).frames)
