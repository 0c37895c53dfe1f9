"""Load a Cosmos3 Omni card's checkpoint: the transformer's understanding pathway and the tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError
from vidloom.core.instance import ModelInstance
from vidloom.layers.attention import DEFAULT_SDPA, SDPAScope, resolve_sdpa_scope
from vidloom.loading.chat_tokenizer import load_chat_tokenizer
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.precision import default_compute_dtype, materialize
from vidloom.loading.safetensors_io import load_weights
from vidloom.families.cosmos3.config import Cosmos3TextConfig
from vidloom.families.cosmos3.transformer import TEXT_NAME_MAP, Cosmos3Transformer, is_generation_key
from vidloom.families.cosmos3.cards import PIPELINE_CLASS, read_pipeline_config


def load_text_model(folder: Path, device: torch.device, dtype: torch.dtype,
                    sdpa: SDPAScope = DEFAULT_SDPA) -> Cosmos3Transformer:
    """The understanding pathway of a diffusers `transformer/` folder (generation weights left unread)."""
    config = Cosmos3TextConfig.from_transformer_config(DiffusersDir.open(folder.parent).component_config(folder.name))
    model = materialize(lambda: Cosmos3Transformer(config, sdpa), device, dtype)
    load_weights(model, folder, TEXT_NAME_MAP, skip=is_generation_key)
    return model.eval()


def load_instance(
    card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None, deploy: DeployConfig
) -> ModelInstance:
    """Read `checkpoint` (a diffusers Cosmos3OmniPipeline folder); CPU computes in `cpu_default_dtype()`."""
    ckpt = DiffusersDir.open(checkpoint)
    ckpt.expect_pipeline(PIPELINE_CLASS)
    pipeline = read_pipeline_config(ckpt)
    ckpt.require(card.components)
    compute = default_compute_dtype(card.precision, device, dtype)
    # Chat, reasoning and the prompt prefill attend causally (masked) through the backbone's KV stores, and the
    # generation pathways share its scope: flash/sage (no masks) are refused here, naming attention_backend.
    sdpa = resolve_sdpa_scope(deploy.attention_backend, device, compute)
    model = load_text_model(ckpt.component_dir("transformer"), device, compute, sdpa)
    tokenizer = load_chat_tokenizer(ckpt.component_dir("text_tokenizer"))
    if len(tokenizer) > model.config.vocab_size:
        raise CheckpointError(f"{ckpt.root}: the tokenizer has {len(tokenizer)} tokens, more than the "
                              f"transformer's vocab_size {model.config.vocab_size}")
    components: dict[str, Any] = {"transformer": model, "tokenizer": tokenizer, "pipeline_config": pipeline}
    if card.tasks:  # the generation pathways, VAE and sampler next to the same backbone
        from vidloom.families.cosmos3.gen_load import load_generation

        components.update(load_generation(ckpt, device, compute, pipeline))
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(ckpt.root), deploy=deploy)

