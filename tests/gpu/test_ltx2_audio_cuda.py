"""LTX-2 audio VAE decode and vocoder on CUDA against the fp32 CPU run of the same weights (unmeasured here:
this branch had no GPU; the bounds are loose on purpose and say why)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.ltx2_audio_fixtures import audio_latents, build_audio_vae, build_vocoder, save_component
from vidloom.models.ltx2.audio_loading import load_audio_vae, load_vocoder


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_and_vocode_on_cuda_match_cpu(tmp_path: Path, dtype: torch.dtype):
    vae_dir = save_component(build_audio_vae("causal-pixel"), tmp_path / "audio_vae")
    vocoder_dir = save_component(build_vocoder("bwe"), tmp_path / "vocoder")
    latents = audio_latents("causal-pixel", 9)
    mel = load_audio_vae(vae_dir).decode(latents)
    wave = load_vocoder(vocoder_dir)(mel)
    cuda_mel = load_audio_vae(vae_dir, "cuda", dtype).decode(latents.to("cuda", dtype)).float().cpu()
    cuda_wave = load_vocoder(vocoder_dir, "cuda", dtype)(cuda_mel.to("cuda", dtype)).float().cpu()
    assert cuda_wave.shape == wave.shape and torch.isfinite(cuda_wave).all()
    if dtype == torch.float32:  # cuDNN may run convs in TF32 (10-bit mantissa): relative ~1e-3
        assert (cuda_mel - mel).abs().max().item() <= 1e-2 * mel.abs().max().item()
        assert (cuda_wave - wave).abs().max().item() <= 1e-2
    else:  # bf16 through ~40 layers: the same signal, not the same samples
        correlation = torch.corrcoef(torch.stack([cuda_wave.flatten(), wave.flatten()]))[0, 1].item()
        assert correlation >= 0.9
