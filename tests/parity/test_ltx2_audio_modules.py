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
    for frames in (7, 9):  # bwe: 7 x 160 samples is not a multiple of its hop 48 (padded), 9 x 160 is
        mel = torch.randn(1, 2, frames, VOCODER_CONFIGS[name][1]["in_channels"] // 2,
                          generator=torch.Generator().manual_seed(frames))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the BWE reads its hop through a deprecated attribute
            expected = reference(mel)
        got = ours(mel)
        assert got.shape == expected.shape == (1, 2, ours.output_samples(frames))
        assert expected.abs().max() > 0.05  # a live signal, not a clamped or silent one
        assert (got - expected).abs().max().item() <= TOLERANCE


def test_audio_latent_layout_matches_the_pipeline():
    from diffusers import LTX2Pipeline

    from vidloom.models.ltx2.audio_vae import LTX2AudioVAEConfig, pack_audio_latents, unpack_audio_latents

    latents = torch.randn(2, 4, 7, 4)
    packed = pack_audio_latents(latents)
    assert torch.equal(packed, LTX2Pipeline._pack_audio_latents(latents))
    assert torch.equal(unpack_audio_latents(packed, 4), LTX2Pipeline._unpack_audio_latents(packed, 7, num_mel_bins=4))
    # LTX2Pipeline: 121 frames at 24 fps, 16 kHz / hop 160 / 4 -> round(5.0417 s x 25) = 126 latent frames
    assert LTX2AudioVAEConfig().latent_frames(121 / 24) == 126


def test_latent_statistics_undo_each_other_as_the_pipeline_applies_them(tmp_path: Path):
    from diffusers import LTX2Pipeline

    reference = build_audio_vae("causal-pixel", seed=4)
    ours = load_audio_vae(save_component(reference, tmp_path / "audio_vae"))
    packed = torch.randn(1, 5, 16)  # 4 latent channels x 4 latent mel bins = base_channels
    expected = LTX2Pipeline._denormalize_audio_latents(packed, reference.latents_mean, reference.latents_std)
    assert torch.equal(ours.denormalize(packed), expected)
    assert torch.allclose(ours.normalize(ours.denormalize(packed)), packed, atol=1e-6)
    with pytest.raises(ValueError, match=r"\[B, T, 16\]"):
        ours.denormalize(torch.randn(1, 5, 8))
