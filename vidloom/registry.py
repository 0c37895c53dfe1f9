"""Explicit tables from model ids / pipeline classes to card builders and loaders (lazy imports)."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError, UnknownModel
from vidloom.core.instance import ModelInstance
from vidloom.core.parallel import SequenceGeometry
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.key_policy import recording_accepted_keys
from vidloom.runtime.fp8_denoisers import quantize_denoisers

log = logging.getLogger(__name__)

# Registered model ids -> "module:function" returning their ModelCard.
CARDS: dict[str, str] = {
    "wan2.1-demo": "vidloom.families.wan.demo:demo_card",
    "wan2.2-demo": "vidloom.families.wan.demo_ti2v:demo_card",
    "far-demo": "vidloom.families.wan_causal.demo:demo_card",
    "cosmos3-demo": "vidloom.families.cosmos3.demo:demo_card",
    "cosmos3-action-demo": "vidloom.families.cosmos3.action_demo:demo_card",
    "qwen-omni-demo": "vidloom.families.qwen_omni.demo:demo_card",
    "flux2-klein-demo": "vidloom.families.flux2.demo:demo_card",
    "ltx2-demo": "vidloom.families.ltx2.demo:demo_card",
    "diffusers-adapter-demo": "vidloom.families.diffusers_adapter.demo:demo_card",
    "sana-wm-demo": "vidloom.families.sana_wm.demo:demo_card",
    "stable-audio-demo": "vidloom.families.stable_audio.demo:demo_card",
    "wan2.1-t2v-1.3b": "vidloom.families.wan.cards:wan21_t2v_1_3b",
    "wan2.1-t2v-14b": "vidloom.families.wan.cards:wan21_t2v_14b",
    "wan2.1-i2v-14b-480p": "vidloom.families.wan.registered:wan21_i2v_14b_480p",
    "wan2.1-i2v-14b-720p": "vidloom.families.wan.registered:wan21_i2v_14b_720p",
    "wan2.1-flf2v-14b-720p": "vidloom.families.wan.registered:wan21_flf2v_14b_720p",
    "wan2.2-ti2v-5b": "vidloom.families.wan.registered:wan22_ti2v_5b",
    "wan2.2-t2v-a14b": "vidloom.families.wan.registered:wan22_t2v_a14b",
    "wan2.2-i2v-a14b": "vidloom.families.wan.registered:wan22_i2v_a14b",
    "fastwan2.1-t2v-1.3b": "vidloom.families.wan.registered:fastwan21_t2v_1_3b",
    "fastwan2.1-t2v-1.3b-fp8": "vidloom.families.wan.registered:fastwan21_t2v_1_3b_fp8",
    "fastwan2.2-ti2v-5b": "vidloom.families.wan.registered:fastwan22_ti2v_5b",
}
# model_index.json "_class_name" -> builder of a card for that folder.
PIPELINES: dict[str, str] = {
    "WanPipeline": "vidloom.families.wan.cards:card_from_checkpoint",
    "AnyFlowFARPipeline": "vidloom.families.wan_causal.cards:card_from_checkpoint",
    "Flux2KleinPipeline": "vidloom.families.flux2.cards:card_from_checkpoint",
    "WanImageToVideoPipeline": "vidloom.families.wan.cards:card_from_checkpoint",
    # FastVideo's name for its DMD-distilled FastWan repos (fastvideo/registry.py): the FastWan recipe.
    "WanDMDPipeline": "vidloom.families.wan.registered:fastwan_card_from_checkpoint",
    "Cosmos3OmniPipeline": "vidloom.families.cosmos3.cards:card_from_checkpoint",
    "LTX2Pipeline": "vidloom.families.ltx2.cards:card_from_checkpoint",
    "LTX2ImageToVideoPipeline": "vidloom.families.ltx2.cards:card_from_checkpoint",
    "SanaWMPipeline": "vidloom.families.sana_wm.cards:card_from_checkpoint",
    "StableAudioPipeline": "vidloom.families.stable_audio.cards:card_from_checkpoint",
}
# Any other diffusers pipeline class: run by diffusers itself as one loop (families/diffusers_adapter).
ADAPTER = "vidloom.families.diffusers_adapter.cards:card_from_checkpoint"
# transformers checkpoints (config.json "architectures", no model_index.json) -> builder of a card for that folder.
ARCHITECTURES: dict[str, str] = {
    "Qwen2_5OmniForConditionalGeneration": "vidloom.families.qwen_omni.cards:card_from_checkpoint",
    # The name the released Qwen/Qwen2.5-Omni-3B and -7B config.json files give (transformers' preview name).
    "Qwen2_5OmniModel": "vidloom.families.qwen_omni.cards:card_from_checkpoint",
}
# Card family -> loader(card, checkpoint_dir, device, dtype, deploy) -> ModelInstance.
LOADERS: dict[str, str] = {
    "wan2.1": "vidloom.families.wan.load:load_instance",
    "anyflow-far": "vidloom.families.wan_causal.load:load_instance",
    "flux2": "vidloom.families.flux2.load:load_instance",
    "wan2.2": "vidloom.families.wan.load:load_instance",
    "cosmos3": "vidloom.families.cosmos3.load:load_instance",
    "ltx2": "vidloom.families.ltx2.load:load_instance",
    "diffusers-adapter": "vidloom.families.diffusers_adapter.load:load_instance",
    "qwen-omni": "vidloom.families.qwen_omni.load:load_instance",
    "sana-wm": "vidloom.families.sana_wm.load:load_instance",
    "stable-audio": "vidloom.families.stable_audio.load:load_instance",
}
# Card family -> function(checkpoint_dir) -> SequenceGeometry, read before parallel workers start.
SEQUENCE_GEOMETRY: dict[str, str] = {
    "wan2.1": "vidloom.families.wan.parallel:sequence_geometry",
    "wan2.2": "vidloom.families.wan.parallel:sequence_geometry",
}
# "demo:<id>" sources -> function(cache_dir) that writes (once) and returns the checkpoint dir.
DEMOS: dict[str, str] = {
    "wan2.1-demo": "vidloom.families.wan.demo:ensure_demo_checkpoint",
    "wan2.2-demo": "vidloom.families.wan.demo_ti2v:ensure_demo_checkpoint",
    "far-demo": "vidloom.families.wan_causal.demo:ensure_demo_checkpoint",
    "cosmos3-demo": "vidloom.families.cosmos3.demo:ensure_demo_checkpoint",
    "cosmos3-action-demo": "vidloom.families.cosmos3.action_demo:ensure_demo_checkpoint",
    "qwen-omni-demo": "vidloom.families.qwen_omni.demo:ensure_demo_checkpoint",
    "flux2-klein-demo": "vidloom.families.flux2.demo:ensure_demo_checkpoint",
    "ltx2-demo": "vidloom.families.ltx2.demo:ensure_demo_checkpoint",
    "diffusers-adapter-demo": "vidloom.families.diffusers_adapter.demo:ensure_demo_checkpoint",
    "sana-wm-demo": "vidloom.families.sana_wm.demo:ensure_demo_checkpoint",
    "stable-audio-demo": "vidloom.families.stable_audio.demo:ensure_demo_checkpoint",
}
DEFAULT_MODEL = "wan2.1-demo"
# Recipes' declared capabilities, {row label: Capabilities} per recipe (`vidloom models --capabilities`).
CAPABILITY_ROWS: tuple[str, ...] = (
    "vidloom.families.wan.cards:CAPABILITY_ROWS",
    "vidloom.families.wan_causal.cards:CAPABILITY_ROWS",
    "vidloom.families.flux2.cards:CAPABILITY_ROWS",
    "vidloom.families.ltx2.cards:CAPABILITY_ROWS",
    "vidloom.families.cosmos3.cards:CAPABILITY_ROWS",
    "vidloom.families.diffusers_adapter.cards:CAPABILITY_ROWS",
    "vidloom.families.qwen_omni.cards:CAPABILITY_ROWS",
    "vidloom.families.sana_wm.cards:CAPABILITY_ROWS",
    "vidloom.families.stable_audio.cards:CAPABILITY_ROWS",
)


def import_target(target: str) -> Callable[..., Any]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def default_cache_dir() -> Path:
    """$VIDLOOM_CACHE, else $XDG_CACHE_HOME/vidloom, else ~/.cache/vidloom."""
    if env := os.environ.get("VIDLOOM_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vidloom"


def list_cards() -> list[ModelCard]:
    return [import_target(target)() for target in CARDS.values()]


# A Hugging Face repo id: "org/name" (letters, digits, "-", "_", "."), as huggingface_hub accepts.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def resolve_card(model: str | Path) -> ModelCard:
    """A registered id, a diffusers checkpoint directory whose pipeline class we know, or a hub repo id."""
    key = str(model)
    if key in CARDS:
        return import_target(CARDS[key])()
    path = Path(key).expanduser()
    if path.is_dir():
        return _card_from_dir(path)
    if _REPO_ID.fullmatch(key) and not path.exists():
        card = _card_from_dir(hub_snapshot(key))
        return dataclasses.replace(card, model_id=key, description=f"{card.description} ({key})")
    raise UnknownModel(
        f"unknown model {key!r}: not a registered id ({', '.join(CARDS)}), not a checkpoint directory "
        "and not a Hugging Face repo id (org/name)"
    )


def _card_from_dir(path: Path) -> ModelCard:
    """The native recipe of the folder's pipeline class, else the diffusers adapter (which refuses, naming why, a
    class diffusers does not ship or one it cannot step)."""
    if not (path / "model_index.json").is_file() and (path / "config.json").is_file():
        return _card_from_transformers_dir(path)
    ckpt = DiffusersDir.open(path)
    if not ckpt.pipeline_class:
        raise CheckpointError(f"{path}/model_index.json names no pipeline class (_class_name)")
    return import_target(PIPELINES.get(ckpt.pipeline_class, ADAPTER))(path)


def _card_from_transformers_dir(path: Path) -> ModelCard:
    from vidloom.loading.diffusers_dir import read_json

    architectures = read_json(path / "config.json").get("architectures") or []
    for name in architectures:
        if name in ARCHITECTURES:
            return import_target(ARCHITECTURES[name])(path)
    raise CheckpointError(f"{path}: config.json architectures {architectures!r} are not supported; supported: "
                          f"{', '.join(ARCHITECTURES)} (or a diffusers folder with model_index.json)")


def resolve_checkpoint(card: ModelCard, cache_dir: Path | None = None) -> Path:
    """The checkpoint directory behind `card.source` (hub sources download when online, see hub_snapshot)."""
    kind, _, name = card.source.partition(":")
    if kind == "demo":
        return import_target(DEMOS[name])(cache_dir or default_cache_dir())
    if kind == "hf":
        return _from_hub_cache(card, name)
    return Path(card.source)


def load_instance(
    card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None, deploy: DeployConfig
) -> ModelInstance:
    """Every load goes through here: the deploy options the card does not declare are refused first."""
    if card.family not in LOADERS:
        raise UnknownModel(f"no loader for family {card.family!r}; known: {', '.join(LOADERS)}")
    check_deploy(card, deploy)
    with recording_accepted_keys() as accepted:
        instance = import_target(LOADERS[card.family])(card, checkpoint, device, dtype, deploy)
    instance.accepted_config_keys = tuple(str(key) for key in accepted)
    for line in instance.accepted_config_keys:
        log.info("%s", line)
    if instance.deploy.fp8_weights:  # a card may turn it on itself (a QAD-trained FP8 checkpoint)
        quantize_denoisers(instance.components, instance.device, instance.dtype, card.model_id)
    return instance


def check_deploy(card: ModelCard, deploy: DeployConfig) -> None:
    """DeployError naming every deploy feature `deploy` turns on that `card` does not declare (core.capabilities)."""
    card.capabilities.refuse_unsupported(deploy, card.model_id, card.family)


def sequence_geometry(card: ModelCard, checkpoint: Path) -> SequenceGeometry:
    """What a parallel plan must divide for this checkpoint (config files only, no weights)."""
    if card.family not in SEQUENCE_GEOMETRY:
        raise DeployError(
            f"{card.model_id}: family {card.family!r} has no multi-device support; "
            f"supported: {', '.join(SEQUENCE_GEOMETRY)}"
        )
    return import_target(SEQUENCE_GEOMETRY[card.family])(checkpoint)


def _from_hub_cache(card: ModelCard, repo_id: str) -> Path:
    return hub_snapshot(repo_id)


def hub_snapshot(repo_id: str) -> Path:
    """The local snapshot of a Hugging Face repo: downloaded (with progress) when online, the cache when
    HF_HUB_OFFLINE=1. Whatever goes wrong becomes one CheckpointError saying how to get the files."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    fix = f"download it with `hf download {repo_id}` (or pass a local checkpoint directory to --model)"
    # Read at call time: huggingface_hub reads HF_HUB_OFFLINE once, when it is first imported.
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(repo_id, local_files_only=offline))
    except RepositoryNotFoundError:
        raise CheckpointError(f"{repo_id}: no such Hugging Face repo (or it is private/gated: log in with `hf auth login`)") from None
    except LocalEntryNotFoundError:
        why = "offline mode (HF_HUB_OFFLINE=1) is on" if offline else "the Hub cannot be reached"
        raise CheckpointError(f"{repo_id}: not in the local Hugging Face cache and {why}; {fix}") from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise CheckpointError(f"{repo_id}: cannot fetch from the Hugging Face Hub ({exc}); {fix}") from None
