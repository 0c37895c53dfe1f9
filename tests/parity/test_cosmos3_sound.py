"""Cosmos3 with sound vs Cosmos3OmniPipeline(enable_sound=True): frames and waveform, same seed; our AVAE
decoder vs diffusers' on the same latents; the mp4 carries the track."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.cosmos3_sound_checkpoints import write_tiny_cosmos3_sound
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.families.cosmos3.gen_load import load_sound_decoder

TOL = 1e-4  # frames in [0, 1] and waveform in [-1, 1], fp32 (issue #13's bound)
KW = dict(prompt="a dog barks at the sea", negative_prompt="silence", num_frames=9, height=32, width=32, fps=24,
          num_inference_steps=3, guidance_scale=3.0, seed=6)


@pytest.fixture(scope="module")
def sound_dir(tmp_path_factory) -> Path:
    return write_tiny_cosmos3_sound(tmp_path_factory.mktemp("cosmos3-sound") / "tiny-cosmos3-sound")


@torch.no_grad()
def test_sound_decoder_matches_diffusers(sound_dir: Path):
    from diffusers import Cosmos3AVAEAudioTokenizer

    reference = Cosmos3AVAEAudioTokenizer.from_pretrained(sound_dir / "sound_tokenizer").eval()
    ours = load_sound_decoder(DiffusersDir.open(sound_dir), reference.config.vocoder_input_dim)
    latents = torch.randn(reference.config.vocoder_input_dim, 17, generator=torch.Generator().manual_seed(0))
    want = reference.decode(latents)
    got = ours(latents)
    assert got.shape == want.shape and want.std() > 1e-2 and (want.abs() < 1).float().mean() > 0.5
    assert (got - want).abs().max().item() <= 1e-5


def test_generation_with_sound_matches_pipeline(sound_dir: Path, tmp_path: Path):
    from diffusers import Cosmos3OmniPipeline

    generator = VideoGenerator.from_pretrained(sound_dir, device="cpu")
    assert generator.card.produces_audio and "sound" in generator.card.option_names
    out = generator.engine.run(GenerationRequest(sound=True, **KW))
    pipe = Cosmos3OmniPipeline.from_pretrained(sound_dir, enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    want = pipe(KW["prompt"], negative_prompt=KW["negative_prompt"], num_frames=KW["num_frames"],
                height=KW["height"], width=KW["width"], fps=KW["fps"],
                num_inference_steps=KW["num_inference_steps"], guidance_scale=KW["guidance_scale"],
                enable_sound=True, generator=torch.Generator("cpu").manual_seed(KW["seed"]), output_type="np",
                enable_safety_check=False)
    frame_diff = float(np.abs(out["video"] - np.asarray(want.video)).max())
    wave_diff = (out["audio"] - want.sound).abs().max().item()
    print(f"sound: max |frame diff| {frame_diff:.2e}, max |waveform diff| {wave_diff:.2e}, "
          f"{tuple(out['audio'].shape)} at {out['sample_rate']} Hz")
    assert out["audio"].shape == want.sound.shape and want.sound.std() > 1e-2
    assert frame_diff <= TOL and wave_diff <= TOL
    # Without sound the frames change (vision tokens attend to the sound tokens) and no audio comes out.
    silent = generator.engine.run(GenerationRequest(**KW))
    assert silent["audio"] is None and np.abs(silent["video"] - out["video"]).max() > 1e-3
    video = generator.generate(sound=True, **KW)
    assert video.audio is not None and video.sample_rate == 8000
    path = video.save(tmp_path / "with-sound.mp4")
    import av

    with av.open(str(path)) as container:
        assert len(container.streams.audio) == 1
