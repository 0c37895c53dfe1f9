"""Load SANA-WM's stage-2 refiner: a diffusers `SanaWMLTX2Refiner` folder at `<checkpoint>/refiner/`
(the LTX-2 refiner DiT, LTX-2 text connectors, a Gemma-3 encoder and tokenizer; the VAE is stage 1's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.precision import materialize
from vidloom.loading.safetensors_io import load_weights
from vidloom.models.ltx2.connectors import LTX2_CONNECTORS_NAME_MAP, LTX2ConnectorsConfig, LTX2TextConnectors
from vidloom.families.sana_wm.checkpoint import load_refiner_transformer
from vidloom.models.ltx2.text import LTX2_TEXT_TOKENS, LTX2TextEncoder
from vidloom.families.sana_wm.refine_loop import RefinerSettings
from vidloom.text_encoders.elsewhere import encoder_or_elsewhere

REFINER_FOLDER = "refiner"
REFINER_PIPELINE = "SanaWMLTX2Refiner"
# SanaWMLTX2Refiner's components with the classes its __init__ takes (what its save_pretrained lists).
REFINER_CLASSES = {
    "transformer": ["diffusers", "SanaWMLTX2RefinerTransformer3DModel"], "connectors": ["ltx2", "LTX2TextConnectors"],
    "tokenizer": ["transformers", "GemmaTokenizer"], "text_encoder": ["transformers", "Gemma3ForConditionalGeneration"],
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
}
REFINER_COMPONENTS = tuple(REFINER_CLASSES)


def open_refiner(folder: Path) -> DiffusersDir:
    """The refiner folder, its index checked. NVIDIA's convert_sana_wm_to_diffusers.py writes refiner/model_index.json
    as only {"text_max_sequence_length": 1024} (no _class_name, no components) and copies transformer/, connectors/
    and text_encoder/: diffusers' SanaWMLTX2Refiner.from_pretrained takes its class and its component names from its
    own signature, so such an index means this pipeline, and the folders say where the components are."""
    ckpt = DiffusersDir.open(folder)
    if ckpt.pipeline_class not in ("", REFINER_PIPELINE):
        raise CheckpointError(f"{folder}: model_index.json says {ckpt.pipeline_class!r}, expected {REFINER_PIPELINE!r}")
    ckpt.check_index(REFINER_COMPONENTS, settings=("text_max_sequence_length",), unsupported={
        "vae": "the refiner decodes with stage 1's VAE"})
    ckpt.require(REFINER_COMPONENTS)  # names each folder the converter did not write (tokenizer, scheduler)
    if not ckpt.pipeline_class:  # read as the folder diffusers would have saved: the signature's components
        ckpt = DiffusersDir(folder, {**REFINER_CLASSES, **ckpt.index, "_class_name": REFINER_PIPELINE})
    return ckpt


def load_refiner(root: Path, device: torch.device, dtype: torch.dtype, latent_channels: int,
                 deploy: DeployConfig | None = None, text_encoder_here: bool = True) -> dict[str, Any]:
    """Components `refiner`, `refiner_text` and `refiner_settings`; errors name the folder and what is wrong.
    The deployment's offload_text_encoder / prompt_cache_size hold for the refiner's Gemma-3 encoder too. Where
    `text_encoder_here` is False (parallel.text_encoder_rank names another rank) `refiner_text` is an
    EncoderElsewhere: the connectors are read only with the encoder, since no LoRA targets the refiner's."""
    deploy = deploy or DeployConfig()
    folder = root / REFINER_FOLDER
    if not (folder / "model_index.json").is_file():
        raise DeployError(f"two_stage (--two-stage) needs SANA-WM's refiner: {root} has no "
                          f"{REFINER_FOLDER}/model_index.json (a {REFINER_PIPELINE} folder)")
    ckpt = open_refiner(folder)
    scheduler = ckpt.component_config("scheduler", "scheduler_config.json")
    if float(scheduler.get("shift", 1.0)) != 1.0 or scheduler.get("use_dynamic_shifting", False):
        # The refiner feeds its distilled sigmas through this scheduler: a shift would move them.
        raise CheckpointError(f"{folder}/scheduler: shift={scheduler.get('shift')} / use_dynamic_shifting="
                              f"{scheduler.get('use_dynamic_shifting')} are not supported (the refiner's "
                              "distilled sigmas run unshifted)")
    transformer = load_refiner_transformer(ckpt.component_dir("transformer"), device, dtype)
    if transformer.config.in_channels != latent_channels:
        raise CheckpointError(f"{folder}/transformer: in_channels {transformer.config.in_channels} != the VAE's "
                              f"{latent_channels} latent channels")
    connectors_config = ckpt.parse_component("connectors", LTX2ConnectorsConfig.from_diffusers)
    text = encoder_or_elsewhere(lambda: _refiner_text(ckpt, connectors_config, device, dtype, deploy), deploy,
                                text_encoder_here, "refiner_text")
    c = connectors_config
    if isinstance(text, LTX2TextEncoder) and (text.hidden_states != c.text_proj_in_factor
                                              or text.hidden_size != c.caption_channels):
        raise CheckpointError(f"{folder}: the text encoder gives {text.hidden_states} hidden states of width "
                              f"{text.hidden_size}, the connectors expect {c.text_proj_in_factor} of width "
                              f"{c.caption_channels}")
    if transformer.config.caption_channels != c.caption_channels:
        raise CheckpointError(f"{folder}: transformer caption_channels {transformer.config.caption_channels} != "
                              f"the connectors' {c.caption_channels}")
    return {"refiner": transformer, "refiner_text": text, "refiner_settings": RefinerSettings()}


def _refiner_text(ckpt: DiffusersDir, config: LTX2ConnectorsConfig, device: torch.device, dtype: torch.dtype,
                  deploy: DeployConfig) -> LTX2TextEncoder:
    """The refiner's prompt path: its Gemma-3 encoder over its own LTX-2 connectors."""
    connectors = materialize(lambda: LTX2TextConnectors(config), device, dtype)
    load_weights(connectors, ckpt.component_dir("connectors"), LTX2_CONNECTORS_NAME_MAP)
    max_length = int(ckpt.index.get("text_max_sequence_length", LTX2_TEXT_TOKENS))
    return LTX2TextEncoder.load(ckpt.component_dir("tokenizer"), ckpt.component_dir("text_encoder"), connectors,
                                device, dtype, max_length=max_length, offload=deploy.offload_text_encoder,
                                cache_size=deploy.prompt_cache_size)
