"""The demos' conditioning visibly matters: another prompt, a negative prompt and a higher guidance each move the frames.

A demo has random weights, so its output is noise, but a user must still see that what they typed reached the
model. Each demo that takes the knob generates once with the base request and once per change (same seed,
float32: the suite's pin), and the frames (uint8) must differ by at least MEAN_MARGIN levels on average and
MAX_MARGIN somewhere. Before the demos scaled their conditioning layers (vidloom.demo.writer.scale_parameters),
wan2.1-demo moved by 4, 1 and 2 levels at most.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vidloom import VideoGenerator

MEAN_MARGIN = 2.0  # levels of 255, averaged over every pixel of every frame
MAX_MARGIN = 24  # levels of 255, the largest single change: visible to the eye (the old demos: 1 to 10)
BASE_PROMPT = "a cat walks on the beach at sunset"
CHANGES = {
    "prompt": {"prompt": "a red sports car drives through a neon city at night"},
    "negative_prompt": {"negative_prompt": "blurry, low quality, dark"},
    "guidance_scale": "raised",  # the card's default guidance, plus GUIDANCE_STEP
}
GUIDANCE_STEP = 3.5  # 4 -> 7.5 on Wan, as the issue measured
FIRST = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8))
# demo -> (its small request, the knobs it takes); flux2-klein is step-distilled (no CFG); far-demo runs without CFG by default (guidance 1, so no negative prompt).
DEMOS = {
    "wan2.1-demo": ({"height": 64, "width": 96, "num_frames": 5}, ("prompt", "negative_prompt", "guidance_scale")),
    "wan2.2-demo": ({"height": 64, "width": 96, "num_frames": 5}, ("prompt", "negative_prompt", "guidance_scale")),
    "far-demo": ({"height": 64, "width": 96, "num_frames": 5}, ("prompt", "guidance_scale")),
    "flux2-klein-demo": ({"height": 64, "width": 64}, ("prompt",)),
    "ltx2-demo": ({}, ("prompt", "negative_prompt", "guidance_scale")),
    "cosmos3-demo": ({}, ("prompt", "negative_prompt", "guidance_scale")),
    "sana-wm-demo": ({"image": FIRST, "camera": "w-8", "intrinsics": [100.0, 100.0, 48.0, 32.0]},
                     ("prompt", "negative_prompt", "guidance_scale")),
    "hunyuan15-demo": ({"num_frames": 5}, ("prompt", "negative_prompt", "guidance_scale")),
}
CASES = [(demo, knob) for demo, (_, knobs) in DEMOS.items() for knob in knobs]


@pytest.fixture(scope="module")
def frames_of():
    """(demo, knob or None) -> the frames [F, H, W, 3] as int16, each demo loaded once."""
    generators: dict[str, VideoGenerator] = {}
    done: dict[tuple[str, str | None], np.ndarray] = {}

    def frames(demo: str, knob: str | None) -> np.ndarray:
        if (demo, knob) not in done:
            gen = generators.setdefault(demo, VideoGenerator.from_pretrained(demo))
            request = {"prompt": BASE_PROMPT, "seed": 11, "num_inference_steps": 3, **DEMOS[demo][0]}
            if knob == "guidance_scale":
                request["guidance_scale"] = gen.card.sampling_defaults.guidance_scale + GUIDANCE_STEP
            elif knob is not None:
                request.update(CHANGES[knob])
            done[demo, knob] = gen.generate(**request).frames.astype(np.int16)
        return done[demo, knob]
    return frames


@pytest.mark.parametrize(("demo", "knob"), CASES, ids=[f"{d}-{k}" for d, k in CASES])
def test_each_knob_moves_the_frames(frames_of, demo, knob):
    base, changed = frames_of(demo, None), frames_of(demo, knob)
    moved = np.abs(changed - base)
    print(f"{demo} {knob}: {moved.mean():.2f} levels on average, {moved.max()} at most")
    assert moved.mean() >= MEAN_MARGIN and moved.max() >= MAX_MARGIN, (
        f"{demo}: {knob} moved the frames by {moved.mean():.2f} levels on average, {moved.max()} at most "
        f"(want >= {MEAN_MARGIN} and >= {MAX_MARGIN})")
