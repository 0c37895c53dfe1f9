"""Load a diffusers `SanaWMTransformer3DModel` folder (config.json + safetensors) onto our SanaWMTransformer."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.loading.config_keys import check_class_name
from vidloom.loading.diffusers_dir import read_json
from vidloom.loading.precision import materialize
from vidloom.loading.safetensors_io import load_weights, skip_prefixes
from vidloom.models.sana_wm.config import SanaWMConfig
from vidloom.models.sana_wm.transformer import SANA_WM_NAME_MAP, SANA_WM_UNUSED_PREFIXES, SanaWMTransformer

TRANSFORMER_CLASS = "SanaWMTransformer3DModel"


def read_transformer_config(folder: Path) -> SanaWMConfig:
    cfg = read_json(folder / "config.json")
    where = str(folder / "config.json")
    check_class_name(cfg, (TRANSFORMER_CLASS,), where)
    return SanaWMConfig.from_diffusers(cfg, where)


def load_transformer(folder: str | Path, device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.float32) -> SanaWMTransformer:
    """The transformer in eval mode on `device` in `dtype`; errors name the folder and the key."""
    folder = Path(folder)
    config = read_transformer_config(folder)
    module = materialize(lambda: SanaWMTransformer(config), torch.device(device), dtype)
    load_weights(module, folder, SANA_WM_NAME_MAP, skip=skip_prefixes(SANA_WM_UNUSED_PREFIXES))
    return module.eval()
