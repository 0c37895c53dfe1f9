"""Stable Audio through the Python API and the CLI on stable-audio-demo: audio out, no frames, files by extension,
bad fields refused by name before anything runs, and the card's capabilities enforced at load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.generator import VideoGenerator
from vidloom.media.audio import read_audio_stream, read_wav
from vidloom.families.stable_audio.demo import DEMO_AUDIO, DEMO_ID, ensure_demo_checkpoint
from vidloom.families.stable_audio.cards import card_from_checkpoint

pytest.importorskip("torchsde")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stable-audio-cache")
    ensure_demo_checkpoint(folder)
    return folder


@pytest.fixture(scope="module")
def gen(cache) -> VideoGenerator:
    return VideoGenerator.from_pretrained(DEMO_ID, device="cpu", cache_dir=cache)


def test_generate_returns_audio_without_frames(gen, tmp_path):
    out = gen.generate("a dog barks", seconds=0.5, seconds_start=0.25, negative_prompt="hiss", num_inference_steps=4,
                       seed=7)
    assert out.frames.shape[0] == 0 and out.num_frames == 0
    assert out.sample_rate == 16000 and out.audio.shape == (2, 8000)
    assert out.duration_s == pytest.approx(0.5)
    assert out.metadata["seconds"] == 0.5 and "height" not in out.metadata
    again = gen.generate("a dog barks", seconds=0.5, seconds_start=0.25, negative_prompt="hiss",
                         num_inference_steps=4, seed=7)
    assert np.array_equal(out.audio, again.audio)  # the seed fixes the initial noise and the Brownian path
    wav = read_wav(out.save(tmp_path / "x.wav"))
    assert wav.sample_rate == 16000 and wav.samples.shape == (2, 8000)
    for ext, rate in ((".flac", 16000), (".mp3", 16000), (".ogg", 48000)):  # Opus decodes at 48 kHz
        track = read_audio_stream(out.save(tmp_path / f"x{ext}"))
        assert track.sample_rate == rate and track.samples.shape[0] == 2
        assert abs(track.samples.shape[1] / rate - 0.5) < 0.1
    with pytest.raises(InvalidRequest, match="output"):
        out.save(tmp_path / "x.mp4")


def test_default_seconds_is_the_window(gen):
    out = gen.generate("rain", num_inference_steps=2, seed=1)
    assert out.audio.shape[1] == int(DEMO_AUDIO.max_seconds * 16000)


@pytest.mark.parametrize("fields,name", [
    (dict(seconds=5.0), "seconds"), (dict(seconds=0.0), "seconds"), (dict(seconds=float("nan")), "seconds"),
    (dict(seconds_start=-1.0), "seconds_start"), (dict(seconds_start=0.8, seconds=0.5), "seconds"), (dict(seconds_start=9.8), "seconds_start"),
    (dict(height=64), "height"), (dict(num_frames=9), "num_frames"), (dict(fps=24), "fps"),
    (dict(image=np.zeros((8, 8, 3), np.uint8)), "image"), (dict(seconds="1"), "seconds"),
])
def test_bad_fields_are_named(gen, fields, name):
    with pytest.raises(InvalidRequest) as info:
        gen.generate("a dog barks", **fields)
    assert info.value.field == name


def test_initial_waveform_from_an_array_or_a_file(gen, tmp_path):
    from vidloom.media.audio import AudioTrack, write_wav

    wave = (np.random.default_rng(0).standard_normal(6000) * 0.2).astype(np.float32)  # mono on a stereo model
    from_array = gen.generate("rain", seconds=0.5, num_inference_steps=3, seed=5, init_audio=wave)
    wav = write_wav(AudioTrack(np.stack([wave, wave]), 16000), tmp_path / "init.wav")
    from_file = gen.generate("rain", seconds=0.5, num_inference_steps=3, seed=5, init_audio=wav)
    # The file holds 16-bit samples: the same waveform up to quantisation, through a 500-sigma start.
    assert float(np.abs(from_array.audio - from_file.audio).max()) < 1e-2 * float(np.abs(from_array.audio).max())
    wrong_rate = write_wav(AudioTrack(np.stack([wave]), 8000), tmp_path / "slow.wav")
    for bad in (wrong_rate, tmp_path / "missing.wav", np.zeros((3, 10), np.float32), np.array([np.nan], np.float32),
                np.zeros(10, np.int16), "not a path"):
        with pytest.raises(InvalidRequest) as info:
            gen.generate("rain", seconds=0.5, init_audio=bad)
        assert info.value.field == "init_audio", bad


def test_seconds_refused_on_a_video_model(demo_cache):
    with VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache) as wan:
        with pytest.raises(InvalidRequest) as info:
            wan.generate("a cat", seconds=1.0)
        assert info.value.field == "seconds"
        with pytest.raises(InvalidRequest) as info:
            wan.generate("a cat", init_audio=np.zeros(16, np.float32))
        assert info.value.field == "init_audio"


def test_memory_estimate_counts_the_window_and_batched_cfg(cache):
    from vidloom.media.request_inputs import resolve_request
    from vidloom.generator import build_request
    from vidloom.runtime.memory import load_estimator

    with VideoGenerator.from_pretrained(DEMO_ID, device="cpu", cache_dir=cache,
                                        deploy=DeployConfig(cfg_mode="batched")) as g:
        estimate = load_estimator(g.engine.instance)
        cfg = resolve_request(build_request(g.card, "x", guidance_scale=7.0), g.card)
        plain = resolve_request(build_request(g.card, "x", guidance_scale=1.0), g.card)
        assert estimate(cfg) >= estimate(plain) > 128 << 20  # the fixed overhead plus the activations


def test_card_from_the_demo_folder_matches_the_demo_card(cache):
    card = card_from_checkpoint(ensure_demo_checkpoint(cache))
    assert card.audio == DEMO_AUDIO and card.family == "stable-audio"


def test_unsupported_deploy_features_are_refused_at_load(cache):
    with pytest.raises(DeployError, match="offload_text_encoder"):
        VideoGenerator.from_pretrained(DEMO_ID, device="cpu", cache_dir=cache,
                                       deploy=DeployConfig(offload_text_encoder=True))


def test_a_vae_tile_off_the_hop_fails_at_load_naming_the_unit(cache):
    # vae_tile is in waveform samples for an audio VAE; the demo's hop is 128 samples per latent step.
    with pytest.raises(DeployError, match=r"vae_tile \(200\).*multiples of 128 \(samples per latent cell"):
        VideoGenerator.from_pretrained(DEMO_ID, device="cpu", cache_dir=cache, deploy=DeployConfig(vae_tile=200))


def test_prompt_cache_and_batched_cfg_are_honoured(cache):
    deploy = DeployConfig(prompt_cache_size=4, cfg_mode="batched")
    with VideoGenerator.from_pretrained(DEMO_ID, device="cpu", cache_dir=cache, deploy=deploy) as g:
        a = g.generate("a dog barks", seconds=0.25, num_inference_steps=3, seed=2)
        b = g.generate("a dog barks", seconds=0.25, num_inference_steps=3, seed=2)
        text = g.engine.instance["text_encoder"]
    assert text.cache.hits >= 1
    with VideoGenerator.from_pretrained(DEMO_ID, device="cpu", cache_dir=cache) as plain:
        c = plain.generate("a dog barks", seconds=0.25, num_inference_steps=3, seed=2)
    assert np.array_equal(a.audio, b.audio)
    # Batched CFG runs the two branches in one forward: equal up to float32 rounding, which the SDE steps and
    # the random decoder amplify (observed 3e-4 of the peak).
    assert float(np.abs(a.audio - c.audio).max()) < 1e-3 * float(np.abs(c.audio).max())


def _cli(args: list[str], cache: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VIDLOOM_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "vidloom.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=cwd)


def test_cli_writes_audio_files(cache, tmp_path):
    done = _cli(["generate", "--model", DEMO_ID, "--prompt", "a dog barks", "--seconds", "0.5", "--steps", "3",
                 "-o", str(tmp_path / "out.flac")], cache, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "0.500s, 2-channel audio @ 16000 Hz" in done.stdout
    assert read_audio_stream(tmp_path / "out.flac").samples.shape[1] == 8000
    bad = _cli(["generate", "--model", DEMO_ID, "--prompt", "x", "--frames", "9", "-o", str(tmp_path / "o.wav")],
               cache, tmp_path)
    assert bad.returncode != 0 and "--frames" in bad.stderr
    video = _cli(["generate", "--model", DEMO_ID, "--prompt", "x", "-o", str(tmp_path / "o.mp4")], cache, tmp_path)
    assert video.returncode != 0 and "--output" in video.stderr and ".flac" in video.stderr
