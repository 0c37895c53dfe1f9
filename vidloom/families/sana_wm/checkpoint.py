"""Load diffusers SANA-WM transformer folders (config.json + safetensors): stage 1 and the stage-2 refiner."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.errors import CheckpointError
from vidloom.layers.attention import AttentionFn, attention
from vidloom.loading.config_keys import check_class_name
from vidloom.loading.diffusers_dir import read_json
from vidloom.loading.precision import materialize
from vidloom.loading.safetensors_io import load_weights, skip_prefixes
from vidloom.models.ltx2.transformer import LTX2_TRANSFORMER_NAME_MAP, LTX2Transformer, LTX2TransformerConfig
from vidloom.families.sana_wm.config import SanaWMConfig
from vidloom.families.sana_wm.refiner import check_refiner_config
from vidloom.families.sana_wm.transformer import SANA_WM_NAME_MAP, SANA_WM_UNUSED_PREFIXES, SanaWMTransformer

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


REFINER_CLASS = "SanaWMLTX2RefinerTransformer3DModel"


def load_refiner_transformer(folder: str | Path, device: torch.device | str = "cpu",
                             dtype: torch.dtype = torch.float32,
                             attention_fn: AttentionFn = attention) -> LTX2Transformer:
    """The stage-2 refiner DiT (LTX-2's parameter layout, run by families/sana_wm/refiner.py) in eval mode."""
    folder = Path(folder)
    where = str(folder / "config.json")
    cfg = read_json(folder / "config.json")
    check_class_name(cfg, (REFINER_CLASS,), where)
    try:
        config = LTX2TransformerConfig.from_diffusers(cfg, where)  # a refused key: CheckpointError naming where
        check_refiner_config(config)
    except ValueError as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    module = materialize(lambda: LTX2Transformer(config, attention_fn), torch.device(device), dtype)
    load_weights(module, folder, LTX2_TRANSFORMER_NAME_MAP)
    return module.eval()
