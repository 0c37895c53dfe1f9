"""sana-wm-demo's stage-2 refiner: a SanaWMLTX2Refiner folder at a tiny size with seeded random weights.

The LTX-2 refiner DiT, LTX-2 text connectors and a tiny Gemma-3 encoder with an offline BPE tokenizer,
written from our own modules with ltx2-demo's writers, so `--two-stage` runs on the demo offline.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.layers.attention import attention
from vidloom.models.ltx2.connectors import LTX2_CONNECTORS_NAME_MAP, LTX2ConnectorsConfig, LTX2TextConnectors
from vidloom.models.ltx2.transformer import LTX2_TRANSFORMER_NAME_MAP, LTX2Transformer, LTX2TransformerConfig
from vidloom.demo.cache import write_json
from vidloom.families.ltx2 import demo as ltx2_demo
from vidloom.families.sana_wm.refiner_load import REFINER_CLASSES, REFINER_PIPELINE

REFINER_SEED = 20261202
# An LTX-2 DiT whose video channels are the demo VAE's 8 latent channels (the refiner reads stage 1's latents).
DEMO_REFINER = {
    **{k: v for k, v in ltx2_demo.DEMO_TRANSFORMER.items() if k != "_class_name"},
    "_class_name": "SanaWMLTX2RefinerTransformer3DModel", "in_channels": 8, "out_channels": 8,
}
DEMO_REFINER_SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 1.0}
REFINER_INDEX = {
    "_class_name": REFINER_PIPELINE,
    **REFINER_CLASSES,
    "vae": [None, None],
    "text_max_sequence_length": 64,
}


def write_demo_refiner(folder: Path) -> None:
    """`folder` (the demo's refiner/) as a SanaWMLTX2Refiner folder without its own VAE (stage 1's decodes)."""
    torch.manual_seed(REFINER_SEED)
    ltx2_demo._save(LTX2Transformer(LTX2TransformerConfig.from_diffusers(DEMO_REFINER), attention),
                    folder / "transformer", LTX2_TRANSFORMER_NAME_MAP, DEMO_REFINER)
    ltx2_demo._save(LTX2TextConnectors(LTX2ConnectorsConfig.from_diffusers(ltx2_demo.DEMO_CONNECTORS)),
                    folder / "connectors", LTX2_CONNECTORS_NAME_MAP, ltx2_demo.DEMO_CONNECTORS)
    tokenizer = ltx2_demo._train_tokenizer()
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    ltx2_demo._write_text_encoder(folder / "text_encoder", len(tokenizer) + 3)
    write_json(folder / "scheduler" / "scheduler_config.json", DEMO_REFINER_SCHEDULER)
    write_json(folder / "model_index.json", REFINER_INDEX)
