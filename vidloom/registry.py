"""The family registry: one lazy list of family packages (plus installed `vidloom.families` entry points), and the
tables derived from their declarations (model ids, pipeline classes, architectures -> card builders; card
families -> loaders); the functions that resolve a model name to a card, a checkpoint and a loaded instance."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.metadata
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from vidloom.core import plugin
from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError, InvalidRequest, UnknownModel, VidloomError
from vidloom.core.family import Family
from vidloom.core.options import OptionBlock, unique_blocks
from vidloom.core.parallel import TokenLayout
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.key_policy import recording_accepted_keys

if TYPE_CHECKING:  # torch loads with the first model, not with `vidloom --help` (tests/unit/test_lazy_imports.py)
    import torch

    from vidloom.core.instance import ModelInstance

log = logging.getLogger(__name__)


class RegistryError(VidloomError):
    """The family declarations contradict each other (an id, pipeline class or card family claimed twice)."""


FAMILIES: tuple[str, ...] = (
    "vidloom.families.wan",
    "vidloom.families.wan_causal",
    "vidloom.families.flux2",
    "vidloom.families.ltx2",
    "vidloom.families.cosmos3",
    "vidloom.families.diffusers_adapter",
    "vidloom.families.qwen_omni",
    "vidloom.families.qwen3_omni",
    "vidloom.families.qwen_image",
    "vidloom.families.hunyuan15",
    "vidloom.families.helios",
    "vidloom.families.sana_wm",
    "vidloom.families.stable_audio",
)
"""The built-in families, one package each exposing `FAMILY` (core.family.Family); their order is the order of
`vidloom models` and of the capability table."""
ENTRY_POINT_GROUP = "vidloom.families"
"""Third-party families: each entry point in this group names a module exposing FAMILY, or the Family itself."""
DEFAULT_MODEL = "wan2.1-demo"


def families() -> tuple[Family, ...]:
    """The built-in families, then the installed third-party ones (read once per process)."""
    return _views().families


def family_of(card_family: str) -> Family:
    """The family whose cards carry ModelCard.family `card_family` (UnknownModel listing the known ones)."""
    family = _views().by_card_family.get(card_family)
    if family is None:
        raise UnknownModel(f"no loader for family {card_family!r}; known: {', '.join(_views().by_card_family)}")
    return family


@functools.cache
def option_blocks() -> dict[str, tuple[OptionBlock, tuple[str, ...]]]:
    """Every option block the families declare: block name -> (the block, the families declaring it), in family
    order; RegistryError when two families declare different blocks under one name, or one option twice."""
    found: dict[str, tuple[OptionBlock, tuple[str, ...]]] = {}
    declared: list[OptionBlock] = []
    for family in families():
        for plug in family.options:
            block = family.resolve(plug)
            if not isinstance(block, OptionBlock):
                raise RegistryError(f"family {family.name!r} options: {plug!r} is not an OptionBlock")
            declared.append(block)
            try:
                unique_blocks(declared)
            except ValueError as exc:
                raise RegistryError(f"family {family.name!r} options: {exc}") from None
            found[block.name] = (block, (*found.get(block.name, (block, ()))[1], family.name))
    return found


def check_options(names: Iterable[str], card: ModelCard) -> None:
    """InvalidRequest naming the first of `names` that is an option of a block `card` does not declare, with the
    block's reason (a name no family declares is left to resolve_request, which lists the card's options)."""
    own = set(card.option_names)
    blocks = [block for block, _ in option_blocks().values()]
    for name in names:
        block = next((b for b in blocks if name in b.names), None)
        if block is not None and name not in own:
            raise InvalidRequest(name, f"{card.model_id} does not take {name}: {block.refusal}")


def __getattr__(name: str) -> Any:
    """The derived tables, under the names earlier code and tests read (built on first use)."""
    if name in _TABLES:
        return getattr(_views(), _TABLES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_TABLES = {"CARDS": "cards", "DEMOS": "demos", "PIPELINES": "pipelines", "ARCHITECTURES": "architectures",
           "LOADERS": "loaders", "TOKEN_LAYOUTS": "token_layouts", "CAPABILITY_ROWS": "capability_rows",
           "ADAPTER": "adapter"}


@dataclasses.dataclass(frozen=True)
class _Views:
    """Every table derived from the families (targets absolute), checked for duplicates once."""

    families: tuple[Family, ...]
    cards: dict[str, str]
    demos: dict[str, str]
    pipelines: dict[str, str]
    architectures: dict[str, str]
    loaders: dict[str, str]
    by_card_family: dict[str, Family]
    token_layouts: dict[str, str]
    capability_rows: tuple[str, ...]
    adapter: str | None


@functools.cache
def _views() -> _Views:
    loaded = tuple(_load(package) for package in FAMILIES) + _entry_point_families()
    owners: dict[tuple[str, str], Family] = {}

    def claim(table: str, key: str, family: Family) -> None:
        other = owners.setdefault((table, key), family)
        if other is not family:
            raise RegistryError(f"{table} {key!r} is declared by two families: {other.name!r} ({other.package}) "
                                f"and {family.name!r} ({family.package})")

    tables: dict[str, dict[str, str]] = {"cards": {}, "demos": {}, "pipelines": {}, "architectures": {}}
    loaders: dict[str, str] = {}
    by_card_family: dict[str, Family] = {}
    layouts: dict[str, str] = {}
    adapters: list[Family] = []
    for family in loaded:
        claim("family", family.name, family)
        declared = {"cards": family.card_builders, "demos": family.demo_writers, "pipelines": family.pipelines,
                    "architectures": family.architectures}
        for table, rows in tables.items():
            for key, target in declared[table].items():
                claim(table, key, family)
                rows[key] = family.target(target)
        for card_family in family.card_families:
            claim("card family", card_family, family)
            by_card_family[card_family] = family
            loaders[card_family] = family.target(family.loader)
            if family.token_layout is not None:
                layouts[card_family] = family.target(family.token_layout)
        if family.catch_all is not None:
            adapters.append(family)
    if len(adapters) > 1:
        raise RegistryError(f"catch_all is declared by two families: {adapters[0].name!r} and {adapters[1].name!r}")
    return _Views(
        families=loaded, **tables, loaders=loaders, by_card_family=by_card_family, token_layouts=layouts,
        capability_rows=tuple(f.target(f.capability_rows) for f in loaded if f.capability_rows is not None),
        adapter=adapters[0].target(adapters[0].catch_all) if adapters else None,  # type: ignore[arg-type]
    )


def reload_families() -> None:
    """Forget the derived tables: the next lookup reads FAMILIES and the installed entry points again."""
    _views.cache_clear()
    option_blocks.cache_clear()


def _load(package: str) -> Family:
    family = plugin.resolve(f"{package}:FAMILY")
    if not isinstance(family, Family):
        raise RegistryError(f"{package}.FAMILY is a {type(family).__name__}, not a vidloom.core.family.Family")
    return family


def _entry_point_families() -> tuple[Family, ...]:
    found = []
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        target = entry.value if ":" in entry.value else f"{entry.value}:FAMILY"
        family = plugin.resolve(target)
        if not isinstance(family, Family):
            raise RegistryError(f"entry point {entry.name!r} ({ENTRY_POINT_GROUP}) names {target}, a "
                                f"{type(family).__name__}, not a vidloom.core.family.Family")
        found.append(family)
    return tuple(found)


def default_cache_dir() -> Path:
    """$VIDLOOM_CACHE, else $XDG_CACHE_HOME/vidloom, else ~/.cache/vidloom."""
    if env := os.environ.get("VIDLOOM_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vidloom"


def list_cards() -> list[ModelCard]:
    return [plugin.resolve(target)() for target in _views().cards.values()]


# A Hugging Face repo id: "org/name" (letters, digits, "-", "_", "."), as huggingface_hub accepts.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def resolve_card(model: str | Path) -> ModelCard:
    """A registered id, a diffusers checkpoint directory whose pipeline class we know, or a hub repo id."""
    key = str(model)
    cards = _views().cards
    if key in cards:
        return plugin.resolve(cards[key])()
    path = Path(key).expanduser()
    if path.is_dir():
        return _card_from_dir(path)
    if _REPO_ID.fullmatch(key) and not path.exists():
        card = _card_from_dir(hub_snapshot(key))
        return dataclasses.replace(card, model_id=key, description=f"{card.description} ({key})")
    close = difflib.get_close_matches(key, list(cards), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UnknownModel(
        f"unknown model {key!r}{hint}: not a registered id ({', '.join(cards)}), not a checkpoint directory "
        "and not a Hugging Face repo id (org/name)"
    )


def _card_from_dir(path: Path) -> ModelCard:
    """The native recipe of the folder's pipeline class (unless its family declines the folder's variant: None),
    else the diffusers adapter (which refuses, naming why, a class diffusers does not ship or one it cannot step)."""
    if not (path / "model_index.json").is_file() and (path / "config.json").is_file():
        return _card_from_transformers_dir(path)
    ckpt = DiffusersDir.open(path)
    if not ckpt.pipeline_class:
        raise CheckpointError(f"{path}/model_index.json names no pipeline class (_class_name)")
    native = _views().pipelines.get(ckpt.pipeline_class)
    card = plugin.resolve(native)(path) if native is not None else None  # None: the family declines this variant
    if card is not None:
        return card
    if _views().adapter is None:
        raise CheckpointError(f"{path}: no family runs pipeline {ckpt.pipeline_class!r}; known: "
                              f"{', '.join(_views().pipelines)}")
    return plugin.resolve(_views().adapter)(path)


def _card_from_transformers_dir(path: Path) -> ModelCard:
    from vidloom.loading.diffusers_dir import read_json

    architectures = read_json(path / "config.json").get("architectures") or []
    known = _views().architectures
    for name in architectures:
        if name in known:
            return plugin.resolve(known[name])(path)
    raise CheckpointError(f"{path}: config.json architectures {architectures!r} are not supported; supported: "
                          f"{', '.join(known)} (or a diffusers folder with model_index.json)")


def resolve_checkpoint(card: ModelCard, cache_dir: Path | None = None) -> Path:
    """The checkpoint directory behind `card.source` (hub sources download when online, see hub_snapshot)."""
    kind, _, name = card.source.partition(":")
    if kind == "demo":
        return plugin.resolve(_views().demos[name])(cache_dir or default_cache_dir())
    if kind == "hf":
        return _from_hub_cache(card, name)
    return Path(card.source)


def load_instance(
    card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None, deploy: DeployConfig,
    text_encoder_here: bool = True,
) -> ModelInstance:
    """Every load goes through here: the deploy options the card does not declare are refused first.

    `text_encoder_here`: False on a rank of a plan whose parallel.text_encoder_rank is another rank; the family's
    loader (which then takes this keyword: its card declares the feature) skips the text encoder's weights."""
    family = family_of(card.family)
    check_deploy(card, deploy)
    extra = {} if text_encoder_here else {"text_encoder_here": False}
    with recording_accepted_keys() as accepted:
        instance = family.resolve(family.loader)(card, checkpoint, device, dtype, deploy, **extra)
    instance.accepted_config_keys = tuple(str(key) for key in accepted)
    for line in instance.accepted_config_keys:
        log.info("%s", line)
    if instance.deploy.fp8_weights:  # a card may turn it on itself (a QAD-trained FP8 checkpoint)
        from vidloom.runtime.fp8_denoisers import quantize_denoisers

        quantize_denoisers(instance.components, instance.device, instance.dtype, card.model_id)
    return instance


def check_deploy(card: ModelCard, deploy: DeployConfig) -> None:
    """DeployError naming every deploy feature `deploy` turns on that `card` does not declare (core.capabilities)."""
    card.capabilities.refuse_unsupported(deploy, card.model_id, card.family)


def token_layout(card: ModelCard, checkpoint: Path) -> TokenLayout:
    """How this checkpoint's tokens shard under a parallel plan (config files only, no weights)."""
    layouts = _views().token_layouts
    if card.family not in layouts:
        raise DeployError(
            f"{card.model_id}: family {card.family!r} has no multi-device support; supported: {', '.join(layouts)}"
        )
    return plugin.resolve(layouts[card.family])(checkpoint)


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
