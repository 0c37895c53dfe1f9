"""A model family's one declaration: what the registry, the loader, LoRA, parity and the capability table need of
it, as lazy plug strings (core.plugin) so listing families imports no network.

Each family folder exposes `FAMILY = Family(...)` in its `__init__.py` (which imports only vidloom.core). Plugs
into the family's own modules are written relative to its package (".cards:demo_card"), and only those: a plug
into a shared package (a NameMap of vidloom.models) is written absolute, and one into a family package is refused.
The registry (vidloom.registry) derives every table from these.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from vidloom.core import plugin


@dataclass(frozen=True, eq=False)
class LoRASupport:
    """Which components take adapters and how a file's keys reach our modules."""

    targets: tuple[tuple[str, str], ...]
    """(instance component, its NameMap plug) for each component an adapter loads into by default; the component
    name is also the file's key prefix."""
    into: Mapping[str, str] = field(default_factory=dict)
    """Component an adapter may be loaded into instead -> the file prefix it reads there (Wan2.2 A14B's low-noise
    expert `transformer_2` reads a file's `transformer.` keys); offered only where the instance has it."""
    converter: str | None = None
    """Plug of `(path, tensors) -> tensors` rewriting community key formats to PEFT keys; None: PEFT keys only."""
    reads: Mapping[str, str] = field(default_factory=dict)
    """Target component -> the file prefix it reads, where that is not its own name. Components sharing a prefix
    split its layers: each layer goes to the one whose NameMap names a linear it has (Cosmos3's `generator`, the
    generation pathways, reads the diffusers transformer's `transformer.` keys beside the chat backbone)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "into", MappingProxyType(dict(self.into)))
        object.__setattr__(self, "reads", MappingProxyType(dict(self.reads)))


@dataclass(frozen=True, eq=False)
class Family:
    """Everything the runtime needs of one model family; the registry holds a list of these."""

    package: str
    """Its Python package: relative plugs resolve inside it, and the layering test keeps its plugs there."""
    card_families: tuple[str, ...]
    """The ModelCard.family values its cards carry (each loads through `loader`)."""
    name: str = ""
    """The family's name; "" = its package's last part (the folder's name)."""
    loader: str = ".load:load_instance"
    """Plug of `load_instance(card, checkpoint_dir, device, dtype, deploy) -> ModelInstance`."""
    cards: Mapping[str, str] = field(default_factory=dict)
    """Registered model id -> plug of `() -> ModelCard` (its demos: `card_builders`)."""
    demos: Mapping[str, str] = field(default_factory=dict)
    """Demo card id -> the module (".demo") whose `demo_card()` is its card and whose
    `ensure_demo_checkpoint(cache_dir)` writes its checkpoint once (the `demo:<id>` source; `demo_writers`)."""
    pipelines: Mapping[str, str] = field(default_factory=dict)
    """diffusers model_index.json `_class_name` -> plug of `(folder) -> ModelCard`."""
    architectures: Mapping[str, str] = field(default_factory=dict)
    """transformers config.json `architectures` entry -> plug of `(folder) -> ModelCard`."""
    catch_all: str | None = None
    """Plug of `(folder) -> ModelCard` for a diffusers pipeline no family names (one family at most declares it)."""
    capability_rows: str | None = ".cards:CAPABILITY_ROWS"
    """Plug of `{row label: Capabilities}` (`vidloom models --capabilities`, the README table)."""
    lora: LoRASupport | None = None
    """LoRA adapter support; None refuses adapters naming the family."""
    parity: str | None = ".parity:PARITY"
    """Plug of its vidloom.parity.family.ParityMaps (`vidloom parity` against the reference pipeline); None: none."""
    token_layout: str | None = None
    """Plug of `(checkpoint_dir) -> core.parallel.TokenLayout`, read from config files in the parent process:
    how its denoiser's tokens shard for --sp and whether its CFG splits for --cfg-parallel; None: one device."""
    options: tuple[str, ...] = ()
    """Plugs of the core.options.OptionBlocks its cards may declare (the family's own, ".options:CAMERA", or
    shared ones, "vidloom.core.blocks:EXTENSION"): `vidloom generate` offers their flags before a card is built."""

    def __post_init__(self) -> None:
        if not self.package or not self.card_families:
            raise ValueError(f"family {self.name or self.package!r}: package and card_families are required")
        if not self.name:
            object.__setattr__(self, "name", self.package.rpartition(".")[2])
        for module in self.demos.values():
            if ":" in module:
                raise plugin.PlugError(f"family {self.name!r} demos: {module!r} names an attribute; a demo is a "
                                       "module (\".demo\") with demo_card() and ensure_demo_checkpoint(cache_dir)")
        if clash := sorted(set(self.demos) & set(self.cards)):
            raise ValueError(f"family {self.name!r}: {clash} are in both cards and demos; a demo's card comes "
                             "from its module's demo_card")
        for name in ("cards", "demos", "pipelines", "architectures"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        for what, target in self.plugs():
            try:
                plugin.check(target)
            except plugin.PlugError as exc:
                raise plugin.PlugError(f"family {self.name!r} {what}: {exc}") from None
            # One spelling for its own modules, and no plug into another family.
            if target.startswith((self.package + ".", "vidloom.families.")):
                raise plugin.PlugError(f"family {self.name!r} {what}: {target!r} points into a family package; "
                                       "write its own modules relative (\".module:attribute\")")

    @property
    def card_builders(self) -> Mapping[str, str]:
        """Every model id it registers -> plug of `() -> ModelCard`: its demos' `demo_card`, then `cards`."""
        return {**{key: f"{module}:demo_card" for key, module in self.demos.items()}, **self.cards}

    @property
    def demo_writers(self) -> Mapping[str, str]:
        """Demo card id -> plug of its `ensure_demo_checkpoint(cache_dir)`."""
        return {key: f"{module}:ensure_demo_checkpoint" for key, module in self.demos.items()}

    def plugs(self) -> Iterator[tuple[str, str]]:
        """(where, plug string) for every plug the declaration holds."""
        yield "loader", self.loader
        tables = {"cards": self.card_builders, "demos": self.demo_writers, "pipelines": self.pipelines,
                  "architectures": self.architectures}
        for table, rows in tables.items():
            for key, target in rows.items():
                yield f"{table}[{key!r}]", target
        for name in ("catch_all", "capability_rows", "parity", "token_layout"):
            if getattr(self, name) is not None:
                yield name, getattr(self, name)
        for i, target in enumerate(self.options):
            yield f"options[{i}]", target
        if self.lora is not None:
            for component, target in self.lora.targets:
                yield f"lora.targets[{component!r}]", target
            if self.lora.converter is not None:
                yield "lora.converter", self.lora.converter

    def target(self, plug: str) -> str:
        """`plug` as an absolute "module:attribute" string."""
        return plugin.absolute(plug, self.package)

    def resolve(self, plug: str) -> Any:
        """The object `plug` names (imported on first use)."""
        return plugin.resolve(plug, self.package)
