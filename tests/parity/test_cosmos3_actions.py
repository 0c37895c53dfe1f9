"""Cosmos3 action runs vs Cosmos3OmniPipeline(action=CosmosActionCondition(...)), same folder and seed.

Each mode on both tiny action configs: forward_dynamics (first frame + actions -> video), policy (first
frame -> video + actions), inverse_dynamics (video -> actions), over several embodiments (their own
projections and widths), conditioning frames that are padded into the canvas and downscaled into it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vidloom import ActionInput
from vidloom.generator import VideoGenerator

FRAMES_TOL = 1e-4  # frames in [0, 1] before uint8 rounding, fp32 (the other cosmos3 parity tests' bound)
ACTIONS_TOL = 1e-4  # predicted actions, fp32: the same sampler arithmetic on [chunk, D] values of order 1
PROMPT = "the arm pushes the red block to the left"
NEGATIVE = "blurry"
TIER = 256  # the smallest canvases (192..320 px) keep the VAE's work small

# mode, domain per config (a, b), conditioning (H, W) or video frames, chunk, steps, guidance, seed
CASES = {
    "forward_dynamics": dict(domains=("pusht", "fractal"), size=(48, 64), frames=1, chunk=4, steps=3,
                             guidance=3.0, seed=3),
    "policy": dict(domains=("av", "pusht"), size=(40, 56), frames=1, chunk=8, steps=3, guidance=3.0, seed=4),
    "policy_downscaled": dict(domains=("bridge_orig_lerobot", "av"), size=(280, 336), frames=1, chunk=4, steps=2,
                              guidance=1.0, seed=5),
    "inverse_dynamics": dict(domains=("bridge_orig_lerobot", "pusht"), size=(48, 48), frames=7, chunk=4, steps=3,
                             guidance=3.0, seed=6),
    "inverse_dynamics_short": dict(domains=("av", "fractal"), size=(32, 48), frames=3, chunk=4, steps=2,
                                   guidance=1.0, seed=7),
}


def _frames(size: tuple[int, int], count: int) -> list[Image.Image]:
    rng = np.random.default_rng(1)
    return [Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)) for _ in range(count)]


def _raw_actions(width: int, steps: int) -> np.ndarray:
    return np.random.default_rng(2).standard_normal((steps, width)).astype(np.float32)


def _mode(case: str) -> str:
    return case.removesuffix("_downscaled").removesuffix("_short")


def _setup(folder: Path, case: str):
    from vidloom.families.cosmos3.actions import RAW_WIDTHS

    kw = CASES[case]
    domain = kw["domains"][0 if "action-a" in folder.name else 1]
    frames = _frames(kw["size"], kw["frames"])
    # forward_dynamics gets one action fewer than the chunk: the last one is repeated, as the reference does
    raw = _raw_actions(RAW_WIDTHS[domain], kw["chunk"] - 1) if _mode(case) == "forward_dynamics" else None
    return kw, domain, frames, raw


def _reference(folder: Path, case: str):
    from diffusers import Cosmos3OmniPipeline
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    kw, domain, frames, raw = _setup(folder, case)
    mode = _mode(case)
    pipe = Cosmos3OmniPipeline.from_pretrained(folder, enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    media = dict(video=frames) if mode == "inverse_dynamics" else dict(image=frames[0])
    condition = CosmosActionCondition(mode=mode, chunk_size=kw["chunk"], domain_name=domain, resolution_tier=TIER,
                                      raw_actions=None if raw is None else torch.from_numpy(raw), **media)
    out = pipe(PROMPT, negative_prompt=NEGATIVE, action=condition, num_inference_steps=kw["steps"],
               guidance_scale=kw["guidance"], generator=torch.Generator("cpu").manual_seed(kw["seed"]),
               output_type="np", enable_safety_check=False)
    actions = None if out.action is None else out.action[0].numpy()
    return np.asarray(out.video), actions


@pytest.mark.parametrize("case", list(CASES))
def test_action_run_matches_cosmos3_pipeline(tiny_cosmos3_action_dir: Path, case: str):
    kw, domain, frames, raw = _setup(tiny_cosmos3_action_dir, case)
    mode = _mode(case)
    generator = VideoGenerator.from_pretrained(tiny_cosmos3_action_dir, device="cpu")
    baseline = generator.engine.caches.bytes_in_use
    media = dict(video=frames) if mode == "inverse_dynamics" else dict(image=frames[0])
    action = ActionInput(mode=mode, domain_name=domain, raw_actions=raw, chunk_size=kw["chunk"],
                         resolution_tier=TIER)
    request_fields = dict(negative_prompt=NEGATIVE, num_inference_steps=kw["steps"], guidance_scale=kw["guidance"],
                          seed=kw["seed"], action=action, **media)
    from vidloom.generator import build_request

    request = build_request(generator.card, PROMPT, **request_fields)
    got = generator.engine.run(request)
    want_video, want_actions = _reference(tiny_cosmos3_action_dir, case)
    assert got["video"].shape == want_video.shape == (kw["chunk"] + 1, *want_video.shape[1:])
    assert want_video.std() > 1e-2, "reference frames are flat; the test would prove nothing"
    frame_diff = float(np.abs(got["video"] - want_video).max())
    print(f"{tiny_cosmos3_action_dir.name} {case} ({domain}): max |frame diff| {frame_diff:.2e}", end="")
    assert frame_diff <= FRAMES_TOL
    if mode == "forward_dynamics":
        assert want_actions is None and got["actions"] is None
    else:
        from vidloom.families.cosmos3.actions import RAW_WIDTHS

        assert want_actions.shape == got["actions"].shape == (kw["chunk"], RAW_WIDTHS[domain])
        assert got["actions"].dtype == np.float32
        action_diff = float(np.abs(got["actions"] - want_actions).max())
        print(f", max |action diff| {action_diff:.2e}", end="")
        assert want_actions.std() > 1e-2
        assert action_diff <= ACTIONS_TOL
    print()
    assert generator.engine.caches.bytes_in_use == baseline


def test_generate_returns_actions_and_the_actions_move_the_video(cosmos3_action_dir: Path):
    """Through the public API: policy returns [chunk, D] float32; different given actions give other frames."""
    generator = VideoGenerator.from_pretrained(cosmos3_action_dir, device="cpu")
    image = _frames((48, 64), 1)[0]
    out = generator.generate(PROMPT, image=image, num_inference_steps=2, seed=1,
                             action=ActionInput(mode="policy", domain_name="pusht", chunk_size=4, resolution_tier=TIER))
    assert out.actions is not None and out.actions.shape == (4, 2) and out.actions.dtype == np.float32
    assert out.frames.shape == (5, 48, 64, 3) and out.metadata["action"]["mode"] == "policy"
    videos = [generator.generate(PROMPT, image=image, num_inference_steps=2, seed=1, action=ActionInput(
        mode="forward_dynamics", domain_name="pusht", chunk_size=4, resolution_tier=TIER,
        raw_actions=np.full((4, 2), value, dtype=np.float32))) for value in (-1.0, 1.0)]
    assert all(v.actions is None for v in videos)
    assert np.abs(videos[0].frames.astype(int) - videos[1].frames.astype(int)).max() > 2
