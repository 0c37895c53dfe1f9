"""LTX-2 audio VAE decoder and vocoder vs diffusers (AutoencoderKLLTX2Audio.decode, LTX2Vocoder,
LTX2VocoderWithBWE) on tiny random configs, fp32 CPU, loaded through our name maps from saved folders."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from tests.helpers.ltx2_audio_fixtures import (
    AUDIO_VAE_CONFIGS, VOCODER_CONFIGS, audio_latents, build_audio_vae, build_vocoder, save_component,
)
from vidloom.models.ltx2.audio_loading import load_audio_vae, load_vocoder

TOLERANCE = 1e-5  # fp32, same operations in the same order; measured errors are ~1e-7 (see the report)


@pytest.mark.parametrize("name", list(AUDIO_VAE_CONFIGS))
def test_audio_vae_decode_matches_diffusers(name: str, tmp_path: Path):
    reference = build_audio_vae(name, seed=3)
    ours = load_audio_vae(save_component(reference, tmp_path / "audio_vae"))
    for frames in (1, 6):  # one latent frame decodes to one mel frame (causal); 6 -> 21
        latents = audio_latents(name, frames, seed=frames)
        with torch.no_grad():
            expected = reference.decode(latents, return_dict=False)[0]
        got = ours.decode(latents)
        assert got.shape == expected.shape == (1, 2, max(4 * frames - 3, 1), AUDIO_VAE_CONFIGS[name]["mel_bins"])
        assert (got - expected).abs().max().item() <= TOLERANCE * max(1.0, expected.abs().max().item())
    assert torch.equal(ours.latents_mean, reference.latents_mean)
    assert torch.equal(ours.latents_std, reference.latents_std)


@pytest.mark.parametrize("name", list(VOCODER_CONFIGS))
def test_vocoder_matches_diffusers(name: str, tmp_path: Path):
    reference = build_vocoder(name, seed=5)
    ours = load_vocoder(save_component(reference, tmp_path / "vocoder"))
    assert ours.sample_rate == reference.config.output_sampling_rate
    mel = torch.randn(1, 2, 7, VOCODER_CONFIGS[name][1]["in_channels"] // 2, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the BWE reads its hop through a deprecated attribute
        expected = reference(mel)
    got = ours(mel)
    assert got.shape == expected.shape == (1, 2, ours.output_samples(7))
    assert expected.abs().max() > 0.05  # a live signal, not a clamped or silent one
    assert (got - expected).abs().max().item() <= TOLERANCE
