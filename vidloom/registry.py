"""Explicit tables from model ids / pipeline classes to card builders and loaders (lazy imports)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Callable

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError, UnknownModel
from vidloom.core.instance import ModelInstance
from vidloom.core.parallel import SequenceGeometry
from vidloom.loading.diffusers_dir import DiffusersDir

# Registered model ids -> "module:function" returning their ModelCard.
CARDS: dict[str, str] = {
    "wan2.1-demo": "vidloom.recipes.wan.demo:demo_card",
    "wan2.1-t2v-1.3b": "vidloom.recipes.wan.cards:wan21_t2v_1_3b",
    "wan2.1-t2v-14b": "vidloom.recipes.wan.cards:wan21_t2v_14b",
    "wan2.1-i2v-14b-480p": "vidloom.recipes.wan.registered:wan21_i2v_14b_480p",
    "wan2.1-i2v-14b-720p": "vidloom.recipes.wan.registered:wan21_i2v_14b_720p",
    "wan2.1-flf2v-14b-720p": "vidloom.recipes.wan.registered:wan21_flf2v_14b_720p",
    "wan2.2-ti2v-5b": "vidloom.recipes.wan.registered:wan22_ti2v_5b",
    "wan2.2-t2v-a14b": "vidloom.recipes.wan.registered:wan22_t2v_a14b",
    "wan2.2-i2v-a14b": "vidloom.recipes.wan.registered:wan22_i2v_a14b",
    "fastwan2.1-t2v-1.3b": "vidloom.recipes.wan.registered:fastwan21_t2v_1_3b",
    "fastwan2.1-t2v-1.3b-fp8": "vidloom.recipes.wan.registered:fastwan21_t2v_1_3b_fp8",
    "fastwan2.2-ti2v-5b": "vidloom.recipes.wan.registered:fastwan22_ti2v_5b",
}
# model_index.json "_class_name" -> builder of a card for that folder.
PIPELINES: dict[str, str] = {
    "WanPipeline": "vidloom.recipes.wan.cards:card_from_checkpoint",
    "WanImageToVideoPipeline": "vidloom.recipes.wan.cards:card_from_checkpoint",
}
# Card family -> loader(card, checkpoint_dir, device, dtype, deploy) -> ModelInstance.
LOADERS: dict[str, str] = {
    "wan2.1": "vidloom.recipes.wan.load:load_instance",
    "wan2.2": "vidloom.recipes.wan.load:load_instance",
}
# Card family -> function(checkpoint_dir) -> SequenceGeometry, read before parallel workers start.
SEQUENCE_GEOMETRY: dict[str, str] = {
    "wan2.1": "vidloom.recipes.wan.parallel:sequence_geometry",
    "wan2.2": "vidloom.recipes.wan.parallel:sequence_geometry",
}
# "demo:<id>" sources -> function(cache_dir) that writes (once) and returns the checkpoint dir.
DEMOS: dict[str, str] = {
    "wan2.1-demo": "vidloom.recipes.wan.demo:ensure_demo_checkpoint",
}
DEFAULT_MODEL = "wan2.1-demo"


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


def resolve_card(model: str | Path) -> ModelCard:
    """A registered id, or a diffusers checkpoint directory whose pipeline class we know."""
    key = str(model)
    if key in CARDS:
        return import_target(CARDS[key])()
    path = Path(key).expanduser()
    if path.is_dir():
        ckpt = DiffusersDir.open(path)
        if ckpt.pipeline_class not in PIPELINES:
            raise CheckpointError(
                f"{path}: pipeline class {ckpt.pipeline_class!r} is not supported; "
                f"supported: {', '.join(PIPELINES)}"
            )
        return import_target(PIPELINES[ckpt.pipeline_class])(path)
    raise UnknownModel(
        f"unknown model {key!r}: not a registered id ({', '.join(CARDS)}) and not a checkpoint directory"
    )


def resolve_checkpoint(card: ModelCard, cache_dir: Path | None = None) -> Path:
    """Find (never download) the checkpoint directory behind `card.source`."""
    kind, _, name = card.source.partition(":")
    if kind == "demo":
        return import_target(DEMOS[name])(cache_dir or default_cache_dir())
    if kind == "hf":
        return _from_hub_cache(card, name)
    return Path(card.source)


def load_instance(
    card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None, deploy: DeployConfig
) -> ModelInstance:
    if card.family not in LOADERS:
        raise UnknownModel(f"no loader for family {card.family!r}; known: {', '.join(LOADERS)}")
    return import_target(LOADERS[card.family])(card, checkpoint, device, dtype, deploy)


def sequence_geometry(card: ModelCard, checkpoint: Path) -> SequenceGeometry:
    """What a parallel plan must divide for this checkpoint (config files only, no weights)."""
    if card.family not in SEQUENCE_GEOMETRY:
        raise DeployError(
            f"{card.model_id}: family {card.family!r} has no multi-device support; "
            f"supported: {', '.join(SEQUENCE_GEOMETRY)}"
        )
    return import_target(SEQUENCE_GEOMETRY[card.family])(checkpoint)


def _from_hub_cache(card: ModelCard, repo_id: str) -> Path:
    # Only files already on disk: vidloom never downloads weights itself.
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        raise CheckpointError(
            f"{card.model_id}: weights for {repo_id} are not on this machine. Download them first, e.g.\n"
            f"  huggingface-cli download {repo_id} --local-dir ./{repo_id.split('/')[-1]}\n"
            f"then pass that directory: --model ./{repo_id.split('/')[-1]}"
        ) from None
