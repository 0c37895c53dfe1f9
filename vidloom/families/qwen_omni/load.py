"""Load a Qwen2.5-Omni transformers checkpoint folder onto our modules through explicit name maps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vidloom.core.errors import CheckpointError
from vidloom.layers.attention import DEFAULT_SDPA, SDPAScope, resolve_sdpa_scope
from vidloom.loading.chat_tokenizer import load_chat_tokenizer
from vidloom.loading.diffusers_dir import read_json
from vidloom.loading.precision import default_compute_dtype, materialize
from vidloom.loading.safetensors_io import load_weights
from vidloom.models.omni_towers import load_processors
from vidloom.families.qwen_omni.config import OmniConfig
from vidloom.families.qwen_omni.decoder import (TALKER_KEYS, TALKER_NAME_MAP, THINKER_KEYS, THINKER_NAME_MAP,
                                              OmniDecoder)

WEIGHTS_STEM = "model"  # transformers' model.safetensors (or its sharded index)


def read_config(folder: Path) -> OmniConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    return OmniConfig.from_raw(read_json(path), str(path))


def _only(prefixes: tuple[str, ...]):
    return lambda key: not key.startswith(prefixes)


def load_thinker(folder: Path, config: OmniConfig, device: torch.device, dtype: torch.dtype,
                 sdpa: SDPAScope = DEFAULT_SDPA) -> OmniDecoder:
    """The thinker's text decoder (its audio and vision towers load apart: load_encoders)."""
    model = materialize(lambda: OmniDecoder(config.thinker, sdpa=sdpa), device, dtype)
    load_weights(model, Path(folder), THINKER_NAME_MAP, stem=WEIGHTS_STEM, skip=_only(THINKER_KEYS))
    return model.eval()


def load_talker(folder: Path, config: OmniConfig, device: torch.device, dtype: torch.dtype,
                sdpa: SDPAScope = DEFAULT_SDPA) -> OmniDecoder:
    if config.talker is None:
        raise CheckpointError(f"{folder}: the checkpoint has no talker (enable_audio_output is false)")
    model = materialize(lambda: OmniDecoder(config.talker, projects_input=True, sdpa=sdpa), device, dtype)
    load_weights(model, Path(folder), TALKER_NAME_MAP, stem=WEIGHTS_STEM, skip=_only(TALKER_KEYS))
    return model.eval()


def load_encoders(folder: Path, device: torch.device, dtype: torch.dtype, sdpa: SDPAScope = DEFAULT_SDPA) -> Any:
    """The thinker's audio and vision towers whose tensors the checkpoint holds (transformers' modules)."""
    from vidloom.families.qwen_omni.encoders import load_encoders as load

    raw = read_json(Path(folder) / "config.json").get("thinker_config") or {}
    return load(Path(folder), raw, device, dtype, WEIGHTS_STEM, sdpa)


def load_token2wav(folder: Path, config: OmniConfig, device: torch.device,
                   sdpa: SDPAScope = DEFAULT_SDPA) -> tuple[Any, Any]:
    """token2wav's DiT and BigVGAN vocoder, always float32 (the reference runs them in float32 only)."""
    from vidloom.families.qwen_omni.dit import DIT_KEYS, DIT_NAME_MAP, CodeToMelDiT
    from vidloom.families.qwen_omni.vocoder import VOCODER_KEYS, VOCODER_NAME_MAP, BigVGAN

    if config.dit is None or config.vocoder is None:
        raise CheckpointError(f"{folder}: the checkpoint has no token2wav (enable_audio_output is false)")
    dit = materialize(lambda: CodeToMelDiT(config.dit, sdpa), device, torch.float32)
    load_weights(dit, Path(folder), DIT_NAME_MAP, stem=WEIGHTS_STEM, skip=_only(DIT_KEYS))
    vocoder = materialize(lambda: BigVGAN(config.vocoder), device, torch.float32)
    load_weights(vocoder, Path(folder), VOCODER_NAME_MAP, stem=WEIGHTS_STEM, skip=_only(VOCODER_KEYS))
    return dit.eval(), vocoder.eval()


def load_instance(card: Any, checkpoint: Path, device: torch.device, dtype: torch.dtype | None,
                  deploy: Any) -> Any:
    """Read a Qwen2.5-Omni folder: thinker and tokenizer always; talker, token2wav and voices when the card speaks.
    CPU computes in `cpu_default_dtype()`; token2wav always in float32 (as the reference). FP8 and compile reach
    both decoders through their compile units (OmniDecoder.compile_units), applied by the runtime."""
    from vidloom.core.instance import ModelInstance
    from vidloom.families.qwen_omni.speakers import load_voices

    folder = Path(checkpoint)
    config = read_config(folder)
    compute = default_compute_dtype(card.precision, device, dtype)
    # Both decoders attend inside their KV stores with a causal mask, token2wav's DiT with a block mask: flash/sage
    # (no masks) are refused here, naming attention_backend; sdpa/math hold every attention call of the instance.
    sdpa = resolve_sdpa_scope(deploy.attention_backend, device, compute)
    tokenizer = load_chat_tokenizer(folder)
    thinker = load_thinker(folder, config, device, compute, sdpa)
    if len(tokenizer) > config.thinker.vocab_size:
        raise CheckpointError(f"{folder}: the tokenizer has {len(tokenizer)} tokens, more than the thinker's "
                              f"vocab_size {config.thinker.vocab_size}")
    components: dict[str, Any] = {"thinker": thinker, "tokenizer": tokenizer, "processors": load_processors(folder),
                                  "encoders": load_encoders(folder, device, compute, sdpa)}
    if card.speech is not None:
        components.update({
            "talker": load_talker(folder, config, device, compute, sdpa), "talker_tokens": config.talker_tokens,
            "token2wav": load_token2wav(folder, config, device, sdpa), "speakers": load_voices(folder),
        })
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(folder), deploy=deploy)
