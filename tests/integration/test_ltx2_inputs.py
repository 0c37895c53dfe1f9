"""LTX-2 bad input: requests, checkpoints and deployments the model cannot take fail naming the field or file."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.helpers.ltx2_checkpoints import TINY_INTERLEAVED
from tests.helpers.ltx2_vae_fixtures import write_upsampler
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError, InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator

OK = dict(prompt="a robot dancing", height=64, width=64, num_frames=9, fps=25, num_inference_steps=2, seed=0)


@pytest.fixture(scope="module")
def gen(ltx2_dir):
    return VideoGenerator.from_pretrained(ltx2_dir, device="cpu")


@pytest.mark.parametrize("field,value,match", [
    ("height", 48, "divisible by 32"),
    ("width", 80, "divisible by 32"),
    ("num_frames", 6, "8k\\+1"),
])
def test_request_the_model_cannot_take_names_the_field(gen, field, value, match):
    with pytest.raises(InvalidRequest, match=match) as info:
        gen.engine.run(GenerationRequest(**{**OK, field: value}))
    assert info.value.field == field


def test_a_good_request_still_runs_after_refusals(gen):
    out = gen.engine.run(GenerationRequest(**OK))
    assert out["video"].shape == (9, 64, 64, 3)
    assert out["audio"].ndim == 2 and out["sample_rate"] > 0


def test_upsampler_for_another_vae_is_refused_naming_the_folder(ltx2_dir, tmp_path):
    wrong = tmp_path / "wrong_upsampler"
    write_upsampler(wrong, TINY_INTERLEAVED.upsampler)  # 16-channel latents; this model's VAE makes 8
    with pytest.raises(CheckpointError, match="wrong_upsampler.*16-channel"):
        VideoGenerator.from_pretrained(ltx2_dir, device="cpu", deploy=DeployConfig(upsampler=str(wrong)))


def test_upsampler_folder_without_config_is_named(ltx2_dir, tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        VideoGenerator.from_pretrained(ltx2_dir, device="cpu", deploy=DeployConfig(upsampler=str(tmp_path)))


def test_two_stage_without_an_upsampler_names_the_flag(ltx2_dir, tmp_path):
    copy = tmp_path / "no_upsampler"
    shutil.copytree(ltx2_dir, copy)
    shutil.rmtree(copy / "latent_upsampler")
    with pytest.raises(DeployError, match="--two-stage.*--upsampler"):
        VideoGenerator.from_pretrained(copy, device="cpu", deploy=DeployConfig(two_stage=True))


def test_unsupported_transformer_key_names_key_and_folder(ltx2_dir, tmp_path):
    copy = tmp_path / "future"
    shutil.copytree(ltx2_dir, copy)
    config = copy / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "use_keyframes_abs_pos_embedding": True}))
    with pytest.raises(CheckpointError, match=f"{copy}.*use_keyframes_abs_pos_embedding"):
        VideoGenerator.from_pretrained(copy, device="cpu")


def test_deploy_options_not_wired_for_ltx2_are_refused(ltx2_dir):
    with pytest.raises(DeployError, match="cfg_mode"):
        VideoGenerator.from_pretrained(ltx2_dir, device="cpu", deploy=DeployConfig(cfg_mode="batched"))


def test_one_step_cannot_reach_the_terminal_sigma(gen):
    with pytest.raises(InvalidRequest, match="shift_terminal") as info:
        gen.engine.run(GenerationRequest(**{**OK, "num_inference_steps": 1}))
    assert info.value.field == "num_inference_steps"


def test_python_api_returns_frames_audio_and_rate(gen, tmp_path):
    from vidloom.media.audio import read_audio_stream

    out = gen.generate("a robot dancing", height=64, width=64, num_frames=9, fps=25, num_inference_steps=2, seed=0)
    assert out.frames.shape == (9, 64, 64, 3)
    assert out.audio.dtype.name == "float32" and out.audio.shape[0] == 2 and out.sample_rate == 24000
    path = out.save(tmp_path / "x.mp4")
    assert read_audio_stream(path).sample_rate == 24000


def test_registry_detects_both_ltx2_pipeline_classes(ltx2_dir, tmp_path):
    from vidloom.core.request import Task
    from vidloom.registry import resolve_card

    card = resolve_card(ltx2_dir)
    assert card.family == "ltx2" and card.produces_audio and {Task.T2V, Task.I2V} <= card.tasks
    assert (card.geometry.spatial_multiple, card.geometry.temporal_factor) == (32, 8)
    copy = tmp_path / "i2v"
    shutil.copytree(ltx2_dir, copy)
    index = copy / "model_index.json"
    index.write_text(json.dumps({**json.loads(index.read_text()), "_class_name": "LTX2ImageToVideoPipeline"}))
    assert resolve_card(copy).family == "ltx2"


def test_prompt_cache_skips_the_encoder_and_gives_the_same_video(ltx2_dir, gen):
    cached = VideoGenerator.from_pretrained(ltx2_dir, device="cpu", deploy=DeployConfig(prompt_cache_size=4))
    encoder = cached.engine.instance["text_encoder"]
    first = cached.engine.run(GenerationRequest(**OK))["video"]
    second = cached.engine.run(GenerationRequest(**OK))["video"]
    plain = gen.engine.run(GenerationRequest(**OK))["video"]
    assert np.array_equal(first, plain) and np.array_equal(second, plain)
    assert (encoder.cache.misses, encoder.cache.hits) == (1, 1)  # one key per request: [negative, prompt]
