"""The parity maps of Stable Audio, SANA-WM, LTX-2 image-to-video and LTX-2 two-stage through `run_parity` on tiny
folders.

Each runs the folder's own diffusers pipeline (the map's reference) beside vidloom: every tap within the default
tolerance (atol = rtol = 1e-4). Then one weight of our block 1 is nudged, and the report names that block at the
first step's first call, with every earlier tap (block 0) still matching.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch
from PIL import Image

from vidloom.cli import main
from vidloom.generator import VideoGenerator, build_request
from vidloom.parity import ParityRun, run_parity

NUDGE = 5e-2  # the scale of random noise added to one linear weight: far beyond the tolerance at that block


@contextmanager
def nudged(block: torch.nn.Module):
    """Add seeded noise of scale NUDGE to the first linear weight of `block` (ours), restored on exit. (Noise,
    not a constant: a constant shift of a weight reading layer-normed tokens, which sum to ~0, moves nothing.)"""
    linear = next(m for m in block.modules() if isinstance(m, torch.nn.Linear))
    noise = torch.randn(linear.weight.shape, generator=torch.Generator().manual_seed(0)) * NUDGE
    with torch.no_grad():
        linear.weight.add_(noise.to(linear.weight))
    try:
        yield
    finally:
        with torch.no_grad():
            linear.weight.sub_(noise.to(linear.weight))


def _assert_ok(result: ParityRun, steps: int, calls: set[int], output: str) -> None:
    report = result.report
    text = report.format()
    assert report.ok, text
    assert {d.key.call for d in report.diffs if d.key.kind == "block"} == calls, text
    assert sum(d.key.kind == "latents" for d in report.diffs) == steps, text
    assert output in {d.key.name for d in report.diffs if d.key.kind == "stage"}, text


def _assert_names_block_1(result: ParityRun) -> None:
    report = result.report
    first = report.first_divergence
    assert first is not None, report.format()
    key = first.key
    assert (key.kind, key.step, key.call) == ("block", 0, 0), report.format()
    assert key.name.split(".")[:2] == ["blocks", "1"], report.format()
    before = [d for d in report.diffs if d.key.kind == "block" and (d.key.loop, d.key.step, d.key.call)
              == (key.loop, 0, 0) and d.key.name.startswith("blocks.0")]  # the block before it, same step and call
    assert before and not any(d.diverged for d in before), report.format()


# --- Stable Audio Open ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stable_audio(tmp_path_factory):
    pytest.importorskip("torchsde")
    from tests.helpers.stable_audio_checkpoints import TINY_STEREO, write_tiny_stable_audio

    folder = write_tiny_stable_audio(tmp_path_factory.mktemp("parity-stable-audio"), TINY_STEREO)
    return folder, VideoGenerator.from_pretrained(folder, device="cpu", dtype=torch.float32), TINY_STEREO


def _audio_request(gen, spec, guidance: float):
    return build_request(gen.card, "a dog barks", negative_prompt="hiss", seconds=spec.max_seconds * 0.6,
                             seconds_start=0.25, num_inference_steps=3, guidance_scale=guidance, seed=3)


@pytest.mark.parametrize("guidance,calls", [(3.0, {0, 1}), (1.0, {0})], ids=["cfg", "no-cfg"])
def test_stable_audio_map_matches(stable_audio, guidance, calls):
    """The pipeline's [uncond, cond] batch is split into our cond / uncond calls."""
    folder, gen, spec = stable_audio
    result = run_parity(folder, _audio_request(gen, spec, guidance), generator=gen)
    _assert_ok(result, 3, calls, "decode.audio")
    assert result.ours.shape == result.theirs.shape == (spec.vae["audio_channels"], result.ours.shape[1])


def test_stable_audio_map_takes_an_initial_waveform(stable_audio):
    folder, gen, spec = stable_audio
    rate, channels = spec.vae["sampling_rate"], spec.vae["audio_channels"]
    wave = (torch.randn(channels, int(0.5 * spec.max_seconds * rate), generator=torch.Generator().manual_seed(9))
            * 0.3).numpy()
    request = build_request(gen.card, "a dog barks", seconds=spec.max_seconds * 0.6, num_inference_steps=3,
                            guidance_scale=3.0, seed=3, init_audio=wave)
    _assert_ok(run_parity(folder, request, generator=gen), 3, {0, 1}, "decode.audio")


def test_stable_audio_nudged_weight_is_named(stable_audio):
    folder, gen, spec = stable_audio
    with nudged(gen.engine.instance["transformer"].blocks[1]):
        _assert_names_block_1(run_parity(folder, _audio_request(gen, spec, 3.0), generator=gen))


def test_stable_audio_command(stable_audio, capsys):
    folder, _, _ = stable_audio
    code = main(["parity", "--model", str(folder), "--steps", "2", "--guidance", "3", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "parity: no divergence over" in out and "stage decode.audio" in out


# --- SANA-WM stage 1 --------------------------------------------------------------------------------------------

SANA_IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 70, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def sana_wm(tmp_path_factory):
    from tests.helpers.sana_wm_checkpoints import CONFIGS, write_tiny_sana_wm

    folder = write_tiny_sana_wm(tmp_path_factory.mktemp("parity-sana-wm"), CONFIGS[0])
    return folder, VideoGenerator.from_pretrained(folder, device="cpu", dtype=torch.float32)


def _sana_request(gen, guidance: float):
    return build_request(gen.card, "a car driving across a desert", negative_prompt="blurry", image=SANA_IMAGE,
                             camera="w-8,jw-8", intrinsics=[50.0, 52.0, 35.0, 20.0], height=64, width=96,
                             num_frames=17, num_inference_steps=2, guidance_scale=guidance, seed=3)


def test_sana_wm_map_matches(sana_wm):
    folder, gen = sana_wm
    _assert_ok(run_parity(folder, _sana_request(gen, 5.0), generator=gen), 2, {0}, "decode.video")


def test_sana_wm_nudged_weight_is_named(sana_wm):
    folder, gen = sana_wm
    with nudged(gen.engine.instance["transformer"].blocks[1]):
        _assert_names_block_1(run_parity(folder, _sana_request(gen, 5.0), generator=gen))


# --- LTX-2 image-to-video ---------------------------------------------------------------------------------------

LTX2_IMAGE = Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 56, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory):
    from tests.helpers.ltx2_checkpoints import CONFIGS, write_tiny_ltx2

    folder = write_tiny_ltx2(tmp_path_factory.mktemp("parity-ltx2"), CONFIGS[0], upsampler=True)
    return folder, VideoGenerator.from_pretrained(folder, device="cpu", dtype=torch.float32)


def _ltx2_request(gen):
    return build_request(gen.card, "a robot dancing in the rain", negative_prompt="blurry", image=LTX2_IMAGE,
                             height=64, width=64, num_frames=9, fps=25, num_inference_steps=2, guidance_scale=3.0,
                             seed=3)


def test_ltx2_image_to_video_map_matches(ltx2):
    """A first frame selects LTX2ImageToVideoPipeline on the LTX2Pipeline folder."""
    folder, gen = ltx2
    result = run_parity(folder, _ltx2_request(gen), generator=gen)
    assert result.reference.family.pipeline == "LTX2ImageToVideoPipeline"
    _assert_ok(result, 2, {0, 1}, "decode_video.video")  # CFG pair, modality (the STG pass perturbs no block here)


def test_ltx2_image_to_video_nudged_weight_is_named(ltx2):
    folder, gen = ltx2
    with nudged(gen.engine.instance["transformer"].blocks[1]):
        _assert_names_block_1(run_parity(folder, _ltx2_request(gen), generator=gen))


# --- LTX-2 two-stage (generate, upsample 2x, refine) --------------------------------------------------------------

def _two_stage_request(gen):
    return build_request(gen.card, "a robot dancing in the rain", negative_prompt="blurry", height=64, width=64,
                         num_frames=9, fps=25, num_inference_steps=2, guidance_scale=3.0, seed=3)


@pytest.fixture(scope="module")
def two_stage(ltx2):
    from vidloom.core.deploy import DeployConfig

    folder, _ = ltx2
    return folder, VideoGenerator.from_pretrained(folder, device="cpu", dtype=torch.float32,
                                                  deploy=DeployConfig(two_stage=True))


def test_ltx2_two_stage_map_matches(two_stage):
    """Both loops tapped: stage 1's steps, then the refinement's (the chain's second LTX2Pipeline call)."""
    folder, gen = two_stage
    result = run_parity(folder, _two_stage_request(gen), generator=gen)
    report = result.report
    assert report.ok, report.format()
    assert result.ours.shape == result.theirs.shape == (9, 128, 128, 3)  # twice the requested size
    steps = {(d.key.loop, d.key.step) for d in report.diffs if d.key.kind == "latents"}
    assert steps == {("stage1", 0), ("stage1", 1), ("stage2", 0), ("stage2", 1), ("stage2", 2)}, report.format()


def test_ltx2_two_stage_nudged_weight_is_named_in_stage_1(two_stage):
    folder, gen = two_stage
    with nudged(gen.engine.instance["transformer"].blocks[1]):
        _assert_names_block_1(run_parity(folder, _two_stage_request(gen), generator=gen))
