"""Tiny LTX-2 video VAEs and latent upsamplers written by diffusers (random weights), for parity tests.

Random init leaves several paths inert (noise-injection scales start at zero, group norms at identity,
latent statistics at 0/1), so a test could pass with them broken; `_perturb` gives every such tensor
random values. Each writer saves a diffusers component folder (config.json + safetensors) and returns
the diffusers module it wrote, so tests can compare against the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

if TYPE_CHECKING:  # diffusers loads where a fixture is built: tests/conftest.py imports this module, and
    # tests/gpu must collect on the GPU image, which has no diffusers
    from diffusers import AutoencoderKLLTX2Video
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

M = TypeVar("M", bound=torch.nn.Module)


@dataclass(frozen=True)
class TinyVideoVAE:
    """One tiny AutoencoderKLLTX2Video configuration and the clip sizes it takes."""

    name: str
    config: dict[str, Any]
    video_shape: tuple[int, int, int, int, int]  # [B, 3, F, H, W]; F = 1 + t*k, H and W multiples of s
    latent_shape: tuple[int, int, int, int, int]  # [B, C, F, h, w] to decode


# LTX-2's stage layout (32x space, 8x time, residual 2x upsamplers) at tiny widths, timestep-free.
VAE_A = TinyVideoVAE(
    name="ltx2-vae-a",
    config=dict(
        latent_channels=8, block_out_channels=(8, 16, 32, 32), layers_per_block=(1, 1, 1, 1, 1),
        decoder_block_out_channels=(16, 32, 64), decoder_layers_per_block=(1, 1, 1, 1),
        decoder_inject_noise=(False, False, False, False), timestep_conditioning=False,
        spatial_compression_ratio=32, temporal_compression_ratio=8,
    ),
    video_shape=(2, 3, 9, 64, 32),
    latent_shape=(2, 8, 2, 2, 3),
)
# The same layout with the decoder's timestep conditioning and per-block noise injection switched on.
VAE_A_TIMESTEP = TinyVideoVAE(
    name="ltx2-vae-a-timestep",
    config={**VAE_A.config, "timestep_conditioning": True, "decoder_inject_noise": (False, True, False, True)},
    video_shape=(1, 3, 17, 32, 32),
    latent_shape=(2, 8, 3, 2, 2),
)
# A different layout: 2x2 patches, a plain strided-conv stage, width-changing up blocks (conv_in),
# non-residual and factor-1 upsamplers, non-causal convs, replicate padding, a scaling factor.
VAE_B = TinyVideoVAE(
    name="ltx2-vae-b",
    config=dict(
        latent_channels=16, block_out_channels=(16, 16, 32, 64), layers_per_block=(1, 2, 1, 1, 2),
        downsample_type=("spatiotemporal", "conv", "spatial", "spatial"), patch_size=2,
        decoder_block_out_channels=(16, 16, 32, 32), decoder_layers_per_block=(1, 1, 2, 1, 1),
        upsample_type=("spatiotemporal", "spatiotemporal", "spatial", "spatial"),
        upsample_factor=(2, 1, 1, 2), upsample_residual=(True, True, False, True),
        decoder_spatio_temporal_scaling=(True, True, True, True),
        decoder_inject_noise=(False, False, False, False, False),
        encoder_causal=False, decoder_causal=False, decoder_spatial_padding_mode="replicate",
        scaling_factor=0.7, spatial_compression_ratio=32, temporal_compression_ratio=4,
    ),
    video_shape=(1, 3, 9, 32, 64),
    latent_shape=(1, 16, 3, 2, 2),
)
VAE_CONFIGS = (VAE_A, VAE_A_TIMESTEP, VAE_B)


@dataclass(frozen=True)
class TinyUpsampler:
    """One tiny LTX2LatentUpsamplerModel configuration; `latent_channels` must match the VAE it serves."""

    name: str
    config: dict[str, Any] = field(default_factory=dict)


UPSAMPLER_A = TinyUpsampler("ltx2-up-a", dict(in_channels=8, mid_channels=32, num_blocks_per_stage=1, dims=3,
                                               spatial_upsample=True, rational_spatial_scale=2.0))
UPSAMPLER_B = TinyUpsampler("ltx2-up-b", dict(in_channels=16, mid_channels=64, num_blocks_per_stage=2, dims=2,
                                               spatial_upsample=True, use_rational_resampler=False))
# Module-level variants only (the pipeline path is spatial): 1.5x rational, and space+time.
UPSAMPLER_RATIONAL = TinyUpsampler("ltx2-up-rational", dict(in_channels=8, mid_channels=32, num_blocks_per_stage=1,
                                                             rational_spatial_scale=1.5))
UPSAMPLER_SPACETIME = TinyUpsampler("ltx2-up-spacetime", dict(in_channels=8, mid_channels=32, num_blocks_per_stage=1,
                                                               spatial_upsample=True, temporal_upsample=True))
UPSAMPLER_CONFIGS = (UPSAMPLER_A, UPSAMPLER_B, UPSAMPLER_RATIONAL, UPSAMPLER_SPACETIME)


def _perturb(module: torch.nn.Module, seed: int) -> None:
    """Give inert-at-init tensors random values so a broken path shows in the outputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith("per_channel_scale"):
                tensor.copy_(0.5 * torch.randn(tensor.shape, generator=gen))
            elif leaf == "latents_mean":
                tensor.copy_(0.3 * torch.randn(tensor.shape, generator=gen))
            elif leaf == "latents_std":
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=gen))
            elif ".norm" in f".{name}" and tensor.ndim == 1 and leaf in ("weight", "bias"):
                base = 1.0 if leaf == "weight" else 0.0
                tensor.copy_(base + 0.2 * torch.randn(tensor.shape, generator=gen))


def _build(cls: type[M], config: dict[str, Any], seed: int) -> M:
    torch.manual_seed(seed)
    module = cls(**config).eval()
    _perturb(module, seed + 1)
    return module


def build_video_vae(spec: TinyVideoVAE, seed: int = 0) -> AutoencoderKLLTX2Video:
    from diffusers import AutoencoderKLLTX2Video

    return _build(AutoencoderKLLTX2Video, spec.config, seed)


def build_upsampler(spec: TinyUpsampler, seed: int = 0) -> LTX2LatentUpsamplerModel:
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

    return _build(LTX2LatentUpsamplerModel, spec.config, seed)


def write_video_vae(folder: Path, spec: TinyVideoVAE, seed: int = 0) -> AutoencoderKLLTX2Video:
    """Save a tiny random AutoencoderKLLTX2Video to `folder` (config.json + safetensors); return it."""
    vae = build_video_vae(spec, seed)
    vae.save_pretrained(folder, safe_serialization=True)
    return vae


def write_upsampler(folder: Path, spec: TinyUpsampler, seed: int = 0) -> LTX2LatentUpsamplerModel:
    """Save a tiny random LTX2LatentUpsamplerModel to `folder`; return it."""
    model = build_upsampler(spec, seed)
    model.save_pretrained(folder, safe_serialization=True)
    return model
