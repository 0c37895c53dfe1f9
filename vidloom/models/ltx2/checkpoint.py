"""Load the LTX-2 video VAE and latent upsampler from diffusers component folders (config.json + safetensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

import torch

from vidloom.core.errors import CheckpointError
from vidloom.loading.diffusers_dir import read_json
from vidloom.loading.key_policy import reading_file
from vidloom.loading.name_map import NameMap
from vidloom.loading.precision import materialize
from vidloom.loading.component_file import build_component
from vidloom.loading.safetensors_io import load_weights
from vidloom.models.ltx2.original_layout import ltx2_vae_layouts
from vidloom.models.ltx2.upsampler import LTX2_UPSAMPLER_NAME_MAP, LTX2LatentUpsampler, LTX2LatentUpsamplerConfig
from vidloom.models.ltx2.video_vae import LTX2_VIDEO_VAE_NAME_MAP, LTX2VideoVAE, LTX2VideoVAEConfig

VIDEO_VAE_CLASS = "AutoencoderKLLTX2Video"
UPSAMPLER_CLASS = "LTX2LatentUpsamplerModel"
M = TypeVar("M", bound=torch.nn.Module)
C = TypeVar("C")


def read_video_vae_config(folder: Path) -> LTX2VideoVAEConfig:
    return _read_config(folder, VIDEO_VAE_CLASS, LTX2VideoVAEConfig.from_diffusers)


def read_upsampler_config(folder: Path) -> LTX2LatentUpsamplerConfig:
    return _read_config(folder, UPSAMPLER_CLASS, LTX2LatentUpsamplerConfig.from_diffusers)


def load_video_vae(folder: str | Path, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32, file: Path | None = None) -> LTX2VideoVAE:
    """An `AutoencoderKLLTX2Video` folder onto our LTX2VideoVAE, in eval mode on `device` in `dtype`; the weights
    come from `file` (a component override) when given, the config from the folder."""
    config = read_video_vae_config(Path(folder))
    return build_component(lambda: LTX2VideoVAE(config), Path(folder), LTX2_VIDEO_VAE_NAME_MAP, file,
                           ltx2_vae_layouts(config), torch.device(device), dtype).eval()


def load_latent_upsampler(folder: str | Path, device: torch.device | str = "cpu",
                          dtype: torch.dtype = torch.float32) -> LTX2LatentUpsampler:
    """An `LTX2LatentUpsamplerModel` folder onto our LTX2LatentUpsampler, in eval mode."""
    config = read_upsampler_config(Path(folder))
    return _load(lambda: LTX2LatentUpsampler(config), Path(folder), LTX2_UPSAMPLER_NAME_MAP, device, dtype)


def _load(build: Callable[[], M], folder: Path, name_map: NameMap, device: torch.device | str,
          dtype: torch.dtype) -> M:
    module = materialize(build, torch.device(device), dtype)  # weights come from the folder, not random init
    load_weights(module, folder, name_map)
    return module.eval()


def _read_config(folder: Path, expected_class: str, parse: Callable[[dict], C]) -> C:
    """Parse `folder/config.json`, refusing another component's config; errors name the folder."""
    cfg = read_json(folder / "config.json")
    found = cfg.get("_class_name", expected_class)
    if found != expected_class:
        raise CheckpointError(f"{folder}/config.json: _class_name is {found!r}, expected {expected_class!r}")
    try:
        with reading_file(folder / "config.json"):
            return parse(cfg)
    except CheckpointError as exc:
        raise CheckpointError(f"{folder}: {exc}") from None
