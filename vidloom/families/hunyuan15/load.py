"""Load a HunyuanVideo-1.5 card's checkpoint: our transformer, the VAE, transformers' Qwen2.5-VL and ByT5 text
encoders (and SigLIP for image to video)."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.layers.attention import AttentionFn, attention
from vidloom.loading.component_file import build_component
from vidloom.loading.diffusers_dir import read_json
from vidloom.families.hunyuan15.transformer import (
    HUNYUAN15_TRANSFORMER_NAME_MAP, Hunyuan15Transformer, Hunyuan15TransformerConfig,
)


def load_transformer(folder: Path, device: torch.device, dtype: torch.dtype, file: Path | None = None,
                     attention_fn: AttentionFn = attention) -> Hunyuan15Transformer:
    """A diffusers `transformer/` folder (config.json + safetensors) as our transformer, in `dtype` on `device`."""
    config = Hunyuan15TransformerConfig.from_diffusers(read_json(Path(folder) / "config.json"))
    return build_component(lambda: Hunyuan15Transformer(config, attention_fn), Path(folder),
                           HUNYUAN15_TRANSFORMER_NAME_MAP, file, (), device, dtype,
                           Hunyuan15Transformer.KEEP_FP32).eval()
