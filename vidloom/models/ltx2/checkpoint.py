"""Load the LTX-2 video VAE and latent upsampler from diffusers component folders (config.json + safetensors)."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.errors import CheckpointError
from vidloom.loading.diffusers_dir import read_json
from vidloom.loading.precision import materialize
from vidloom.loading.safetensors_io import load_weights
from vidloom.models.ltx2.upsampler import LTX2_UPSAMPLER_NAME_MAP, LTX2LatentUpsampler, LTX2LatentUpsamplerConfig
from vidloom.models.ltx2.video_vae import LTX2_VIDEO_VAE_NAME_MAP, LTX2VideoVAE, LTX2VideoVAEConfig

VIDEO_VAE_CLASS = "AutoencoderKLLTX2Video"
UPSAMPLER_CLASS = "LTX2LatentUpsamplerModel"


def read_video_vae_config(folder: Path) -> LTX2VideoVAEConfig:
    cfg = _config(folder, VIDEO_VAE_CLASS)
    try:
        return LTX2VideoVAEConfig.from_diffusers(cfg)
    except CheckpointError as exc:
        raise CheckpointError(f"{folder}: {exc}") from None


def read_upsampler_config(folder: Path) -> LTX2LatentUpsamplerConfig:
    cfg = _config(folder, UPSAMPLER_CLASS)
    try:
        return LTX2LatentUpsamplerConfig.from_diffusers(cfg)
    except CheckpointError as exc:
        raise CheckpointError(f"{folder}: {exc}") from None


def load_video_vae(folder: str | Path, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32) -> LTX2VideoVAE:
    """An `AutoencoderKLLTX2Video` folder onto our LTX2VideoVAE, in eval mode on `device` in `dtype`."""
    folder = Path(folder)
    config = read_video_vae_config(folder)
    vae = materialize(lambda: LTX2VideoVAE(config), torch.device(device), dtype)
    load_weights(vae, folder, LTX2_VIDEO_VAE_NAME_MAP)
    return vae.eval()


def load_latent_upsampler(folder: str | Path, device: torch.device | str = "cpu",
                          dtype: torch.dtype = torch.float32) -> LTX2LatentUpsampler:
    """An `LTX2LatentUpsamplerModel` folder onto our LTX2LatentUpsampler, in eval mode."""
    folder = Path(folder)
    config = read_upsampler_config(folder)
    upsampler = materialize(lambda: LTX2LatentUpsampler(config), torch.device(device), dtype)
    load_weights(upsampler, folder, LTX2_UPSAMPLER_NAME_MAP)
    return upsampler.eval()


def _config(folder: Path, expected_class: str) -> dict:
    cfg = read_json(folder / "config.json")
    found = cfg.get("_class_name", expected_class)
    if found != expected_class:
        raise CheckpointError(f"{folder}/config.json: _class_name is {found!r}, expected {expected_class!r}")
    return cfg
