"""Tiny LTX-2 audio VAEs and vocoders written by diffusers (random weights), for parity tests and pipelines.

Random init leaves some paths inert (Snake's log-alpha/beta start at 0, latent statistics at 0/1, the
BWE analysis bases at 0), so a parity test could pass with them wired wrongly. `randomize` perturbs every
parameter and buffer the checkpoint stores; the BWE's DFT basis is a real Hann-windowed one so the
log-mel it computes is a spectrogram, not a constant.

Sizes are consistent with an LTX-2 pipeline: the audio VAE's base_channels equals latent_channels x
mel_bins / 4 (the packed latent width its statistics cover) and a vocoder's in_channels equals
output_channels x mel_bins; the first three vocoders turn 100 mel frames/s (16 kHz, hop 160) into a
24 kHz (or 48 kHz) waveform, like the real ones.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

# Audio VAE configs (AutoencoderKLLTX2Audio kwargs), one per family of options the decoder has.
AUDIO_VAE_CONFIGS: dict[str, dict[str, Any]] = {
    # LTX-2's layout: pixel norm, causal along time, no attention
    "causal-pixel": dict(base_channels=16, output_channels=2, ch_mult=(1, 2), num_res_blocks=1,
                         latent_channels=4, norm_type="pixel", causality_axis="height", mel_bins=16,
                         sample_rate=16000, mel_hop_length=160, resolution=16),
    # group norm (only non-causal), attention in the deepest stage and the middle
    "group-attention": dict(base_channels=32, output_channels=2, ch_mult=(1, 2), num_res_blocks=1,
                            latent_channels=8, norm_type="group", causality_axis="none", mel_bins=16,
                            attn_resolutions=(8,), mid_block_add_attention=True, resolution=16,
                            sample_rate=16000, mel_hop_length=160),
    # causal along mel bins, three stages
    "width-three-stages": dict(base_channels=8, output_channels=2, ch_mult=(1, 1, 2), num_res_blocks=2,
                               latent_channels=2, norm_type="pixel", causality_axis="width", mel_bins=16,
                               sample_rate=16000, mel_hop_length=160, resolution=16),
}

# Vocoder configs: (diffusers class name, kwargs).
VOCODER_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # LTX-2.0's kind: leaky ReLU, tanh out; 240 samples per mel frame (24 kHz from 100 frames/s)
    "hifigan": ("LTX2Vocoder", dict(in_channels=32, hidden_channels=32, out_channels=2,
                                    upsample_kernel_sizes=[12, 11, 16], upsample_factors=[6, 5, 8],
                                    resnet_kernel_sizes=[3, 5], resnet_dilations=[[1, 3], [1, 2]],
                                    act_fn="leaky_relu", leaky_relu_negative_slope=0.1, final_act_fn="tanh",
                                    output_sampling_rate=24000)),
    # Snake (no beta) without anti-aliasing inside the blocks, anti-aliased SnakeBeta out, clamp, no bias
    "snake-clamp": ("LTX2Vocoder", dict(in_channels=32, hidden_channels=16, out_channels=2,
                                        upsample_kernel_sizes=[12, 9, 16], upsample_factors=[6, 5, 8],
                                        resnet_kernel_sizes=[3], resnet_dilations=[[1, 2]],
                                        act_fn="snake", antialias=False, final_act_fn="clamp", final_bias=False,
                                        output_sampling_rate=24000)),
    # LTX-2.3's kind: anti-aliased SnakeBeta at 16 kHz, then bandwidth extension to 48 kHz. hop_length 48 does
    # not divide the 160 samples per mel frame, so the pad-to-hop branch runs.
    "bwe": ("LTX2VocoderWithBWE", dict(
        in_channels=32, hidden_channels=16, out_channels=2, upsample_kernel_sizes=[12, 4, 8],
        upsample_factors=[10, 4, 4], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3]], act_fn="snakebeta",
        antialias=True, final_act_fn=None, final_bias=False,
        bwe_in_channels=16, bwe_hidden_channels=16, bwe_out_channels=2, bwe_upsample_kernel_sizes=[12, 8, 12],
        bwe_upsample_factors=[6, 4, 6], bwe_resnet_kernel_sizes=[3, 5], bwe_resnet_dilations=[[1], [1, 2]],
        bwe_act_fn="snakebeta", bwe_antialias=True, bwe_final_act_fn=None, bwe_final_bias=False,
        filter_length=64, hop_length=48, window_length=64, num_mel_channels=8,
        input_sampling_rate=16000, output_sampling_rate=48000)),
}


def build_audio_vae(name: str, seed: int = 0) -> Any:
    """A diffusers AutoencoderKLLTX2Audio of config `name` with every stored tensor randomised."""
    from diffusers import AutoencoderKLLTX2Audio

    torch.manual_seed(seed)
    vae = AutoencoderKLLTX2Audio(**AUDIO_VAE_CONFIGS[name]).eval()
    randomize(vae, seed)
    return vae


def build_vocoder(name: str, seed: int = 0) -> Any:
    """A diffusers LTX2Vocoder / LTX2VocoderWithBWE of config `name` with every stored tensor randomised."""
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, LTX2VocoderWithBWE

    class_name, kwargs = VOCODER_CONFIGS[name]
    torch.manual_seed(seed)
    vocoder = (LTX2VocoderWithBWE if class_name == "LTX2VocoderWithBWE" else LTX2Vocoder)(**kwargs).eval()
    randomize(vocoder, seed)
    return vocoder


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Perturb what random init leaves degenerate; keep the anti-aliasing filters (their taps are designed)."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            leaf = name.rsplit(".", 1)[-1]
            noise = torch.randn(tensor.shape, generator=generator)
            if leaf in ("alpha", "beta"):  # Snake log-parameters: frequencies / amplitudes around 1
                tensor.copy_(0.3 * noise)
            elif leaf == "latents_mean":
                tensor.copy_(0.5 * noise)
            elif leaf == "latents_std":
                tensor.copy_(0.5 + noise.abs())
            elif leaf == "forward_basis":
                tensor.copy_(hann_dft_basis(tensor.shape[-1], tensor.shape[0] // 2))
            elif leaf == "inverse_basis":
                tensor.copy_(0.1 * noise)
            elif leaf == "mel_basis":
                tensor.copy_(torch.rand(tensor.shape, generator=generator) * 0.2)
            elif leaf == "bias":
                tensor.copy_(0.05 * noise)


def hann_dft_basis(filter_length: int, freqs: int) -> torch.Tensor:
    """[2 * freqs, 1, filter_length]: Hann-windowed cosine rows, then sine rows (a causal STFT as a conv)."""
    n = torch.arange(filter_length, dtype=torch.float64)
    k = torch.arange(freqs, dtype=torch.float64)[:, None]
    window = torch.hann_window(filter_length, periodic=True, dtype=torch.float64)
    angle = 2 * math.pi * k * n / filter_length
    return torch.cat([torch.cos(angle) * window, -torch.sin(angle) * window]).unsqueeze(1).float()


def save_component(model: Any, folder: Path) -> Path:
    """Write `model` as a diffusers component folder (config.json + diffusion_pytorch_model.safetensors)."""
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def audio_latents(name: str, frames: int, seed: int = 0) -> torch.Tensor:
    """Unpacked audio latents [1, latent_channels, frames, mel_bins / 4] for VAE config `name`."""
    config = AUDIO_VAE_CONFIGS[name]
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, config["latent_channels"], frames, config["mel_bins"] // 4, generator=generator)
