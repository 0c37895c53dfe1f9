"""sana-wm-demo's stage-2 refiner: a SanaWMLTX2Refiner folder at a tiny size with seeded random weights.

The LTX-2 refiner DiT, LTX-2 text connectors and a tiny Gemma-3 encoder with an offline BPE tokenizer,
written from our own modules with ltx2-demo's parts (vidloom.models.ltx2.demo_parts), so `--two-stage` runs
on the demo offline.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.demo.writer import write_parts, write_pipeline_files
from vidloom.families.sana_wm.refiner_load import REFINER_CLASSES, REFINER_PIPELINE
from vidloom.models.ltx2 import demo_parts as ltx2_parts

REFINER_SEED = 20261202
# An LTX-2 DiT whose video channels are the demo VAE's 8 latent channels (the refiner reads stage 1's latents).
DEMO_REFINER = {
    **{k: v for k, v in ltx2_parts.DEMO_TRANSFORMER.items() if k != "_class_name"},
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
    write_parts(folder, (ltx2_parts.transformer_part(DEMO_REFINER), ltx2_parts.connectors_part()))
    tokenizer = ltx2_parts.train_tokenizer()
    ltx2_parts.write_text_encoder(folder / "text_encoder", len(tokenizer) + 3)
    write_pipeline_files(folder, DEMO_REFINER_SCHEDULER, REFINER_INDEX, tokenizer)
