"""Load a Qwen3-Omni transformers checkpoint folder's thinker decoder, towers, processors and tokenizer (and its
talker and code2wav when the card speaks) through explicit name maps."""

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
from vidloom.families.qwen3_omni.code2wav import load_code2wav
from vidloom.families.qwen3_omni.config import Qwen3OmniConfig
from vidloom.models.omni_towers import load_processors
from vidloom.families.qwen3_omni.encoders import load_encoders
from vidloom.families.qwen3_omni.decoder import THINKER_KEYS, THINKER_NAME_MAP, MoEDecoder
from vidloom.families.qwen3_omni.talker import TALKER_KEYS, TALKER_NAME_MAP, Talker

WEIGHTS_STEM = "model"  # transformers' model.safetensors (or its sharded index)


def read_config(folder: Path) -> Qwen3OmniConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    return Qwen3OmniConfig.from_raw(read_json(path), str(path))


def load_thinker(folder: Path, config: Qwen3OmniConfig, device: torch.device, dtype: torch.dtype,
                 sdpa: SDPAScope = DEFAULT_SDPA) -> MoEDecoder:
    """The thinker's text decoder; every other part of the checkpoint (towers, talker, code2wav) is left unread.
    With a talker, `return_hidden` gives the state at its accept_hidden_layer (what the talker reads)."""
    tap = config.speech.accept_hidden_layer if config.speech is not None else None
    model = materialize(lambda: MoEDecoder(config.thinker, sdpa=sdpa, tap_layer=tap), device, dtype)
    load_weights(model, Path(folder), THINKER_NAME_MAP, stem=WEIGHTS_STEM,
                 skip=lambda key: not key.startswith(THINKER_KEYS))
    return model.eval()


def load_talker(folder: Path, config: Qwen3OmniConfig, device: torch.device, dtype: torch.dtype,
                sdpa: SDPAScope = DEFAULT_SDPA) -> Talker:
    """The talker: input projections, MoE decoder and code predictor (code2wav is left unread: not built yet)."""
    if config.talker is None or config.speech is None:
        raise CheckpointError(f"{folder}: the checkpoint has no talker (enable_audio_output is false)")
    model = materialize(lambda: Talker(config, sdpa=sdpa), device, dtype)
    load_weights(model, Path(folder), TALKER_NAME_MAP, stem=WEIGHTS_STEM,
                 skip=lambda key: not key.startswith(TALKER_KEYS))
    return model.eval()


def load_instance(card: Any, checkpoint: Path, device: torch.device, dtype: torch.dtype | None,
                  deploy: Any) -> Any:
    """Read a Qwen3-Omni folder: the thinker's decoder, its towers and processors where the folder has them, and the
    tokenizer (CPU computes in cpu_default_dtype())."""
    from vidloom.core.instance import ModelInstance

    folder = Path(checkpoint)
    config = read_config(folder)
    compute = default_compute_dtype(card.precision, device, dtype)
    # The decoder attends inside its KV store with a causal mask: flash/sage (no masks) are refused here.
    sdpa = resolve_sdpa_scope(deploy.attention_backend, device, compute)
    tokenizer = load_chat_tokenizer(folder)
    if len(tokenizer) > config.thinker.vocab_size:
        raise CheckpointError(f"{folder}: the tokenizer has {len(tokenizer)} tokens, more than the thinker's "
                              f"vocab_size {config.thinker.vocab_size}")
    thinker = load_thinker(folder, config, device, compute, sdpa)
    thinker_raw = read_json(folder / "config.json").get("thinker_config") or {}
    components: dict[str, Any] = {"thinker": thinker, "tokenizer": tokenizer, "processors": load_processors(folder),
                                  "encoders": load_encoders(folder, thinker_raw, device, compute, WEIGHTS_STEM, sdpa)}
    if card.speech is not None and config.speech is not None:
        components.update({"talker": load_talker(folder, config, device, compute, sdpa), "speech": config.speech,
                           # float32 like Qwen2.5-Omni's token2wav: a waveform's small samples
                           "code2wav": load_code2wav(folder, read_json(folder / "config.json"), device,
                                                     torch.float32, WEIGHTS_STEM)})
    return ModelInstance(card=card, components=components, device=device,
                         dtype=compute, checkpoint_dir=str(folder), deploy=deploy)
