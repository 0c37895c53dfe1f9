"""The family registry: built-in declarations resolve, a third-party family registers through the
`vidloom.families` entry point group, and two families claiming one id fail naming both."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from vidloom import registry
from vidloom.core import plugin
from vidloom.core.card import ModelCard
from vidloom.core.family import Family
from vidloom.core.options import Option, OptionBlock
from vidloom.loading.name_map import NameMap
from vidloom.parity.family import ParityMaps

TINY = "vidloom_tiny_family"

# A third-party family: its card is Stable Audio's demo card under its own id and card family.
TINY_INIT = '''
from vidloom.core.family import Family

FAMILY = Family(
    package=__name__,
    card_families=("tiny",),
    name="tiny",
    loader=".cards:load_instance",
    cards={{{cards}}},
    pipelines={{"TinyPipeline": ".cards:card_from_checkpoint"}},
    capability_rows=None,
    parity=None,
)
'''
TINY_CARDS = '''
import dataclasses

from vidloom.core import plugin


def tiny_card():
    base = plugin.resolve("vidloom.families.stable_audio.demo:demo_card")()
    return dataclasses.replace(base, model_id="tiny-model", family="tiny", description="a third-party family")


def card_from_checkpoint(folder):
    return dataclasses.replace(tiny_card(), source=str(folder))


def load_instance(card, checkpoint, device, dtype, deploy):
    raise NotImplementedError("the registry test loads no weights")
'''


@pytest.fixture
def install_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Install a distribution whose `vidloom.families` entry point names the tiny family (cards given as the
    body of its `cards` dict), the way pip would leave it on sys.path."""

    def install(cards: str = '"tiny-model": ".cards:tiny_card"') -> None:
        package = tmp_path / TINY
        package.mkdir()
        (package / "__init__.py").write_text(TINY_INIT.format(cards=cards))
        (package / "cards.py").write_text(TINY_CARDS)
        dist = tmp_path / f"{TINY}-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {TINY}\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\ntiny = {TINY}\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        registry.reload_families()

    yield install
    for name in [m for m in sys.modules if m == TINY or m.startswith(TINY + ".")]:
        del sys.modules[name]
    monkeypatch.undo()
    registry.reload_families()


def test_a_third_party_family_registers_through_an_entry_point(install_family, tmp_path):
    install_family()
    assert "tiny" in [family.name for family in registry.families()]
    assert registry.CARDS["tiny-model"] == f"{TINY}.cards:tiny_card"
    card = registry.resolve_card("tiny-model")
    assert isinstance(card, ModelCard) and (card.model_id, card.family) == ("tiny-model", "tiny")
    assert registry.family_of("tiny").name == "tiny"
    assert registry.LOADERS["tiny"] == f"{TINY}.cards:load_instance"
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "TinyPipeline"}))
    assert registry.resolve_card(folder).source == str(folder)  # its pipeline class, not the catch-all


def test_the_built_in_families_come_back_once_it_is_gone():
    registry.reload_families()
    assert "tiny-model" not in registry.CARDS and "wan2.1-demo" in registry.CARDS


def test_two_families_claiming_one_card_id_fail_naming_both(install_family):
    install_family('"wan2.1-demo": ".cards:tiny_card"')
    with pytest.raises(registry.RegistryError, match=r"cards 'wan2.1-demo' .*'wan'.*'tiny'"):
        registry.resolve_card("wan2.1-demo")


def test_every_family_plug_resolves_to_what_its_field_promises():
    expected: dict[str, Callable[[object], bool]] = {
        "loader": callable, "cards": callable, "demos": callable, "pipelines": callable, "architectures": callable,
        "catch_all": callable, "token_layout": callable, "lora.converter": callable,
        "capability_rows": lambda rows: isinstance(rows, Mapping) and bool(rows),
        "parity": lambda maps: isinstance(maps, ParityMaps),
        "lora.targets": lambda name_map: isinstance(name_map, NameMap),
        "options": lambda block: isinstance(block, OptionBlock),
    }
    for family in registry.families():
        for where, plug in family.plugs():
            value = family.resolve(plug)
            assert expected[where.partition("[")[0]](value), f"{family.name} {where}: {plug} -> {value!r}"


def test_every_card_builder_returns_the_card_it_is_registered_as():
    for card_id in registry.CARDS:
        card = registry.resolve_card(card_id)
        assert card.model_id == card_id
        assert registry.family_of(card.family) is next(f for f in registry.families() if card_id in f.card_builders)
        # The CLI offers a block's flags from the family's declaration, before any card is built: it lists them all.
        declared = {block.name for block, families in registry.option_blocks().values()
                    if registry.family_of(card.family).name in families}
        assert set(card.request_blocks) <= declared, f"{card_id}: blocks {set(card.request_blocks) - declared} " \
                                                     "are missing from its family's options"


CLASHING_CAMERA = OptionBlock("camera", (Option("camera", "float", "a number"),), summary="s", refusal="r")


def test_two_families_declaring_different_blocks_under_one_name_fail(monkeypatch):
    clash = Family(package=__name__, card_families=("clash",), name="clash", parity=None, capability_rows=None,
                   options=(f"{__name__}:CLASHING_CAMERA",))
    monkeypatch.setattr(registry, "families", lambda: (*registry._views().families, clash))
    registry.option_blocks.cache_clear()
    try:
        with pytest.raises(registry.RegistryError, match="camera"):
            registry.option_blocks()
    finally:
        registry.option_blocks.cache_clear()


def test_a_malformed_plug_or_demo_is_refused_at_declaration():
    with pytest.raises(plugin.PlugError, match="loader"):
        Family(package="bad", card_families=("bad",), loader="bad.load.load_instance")
    with pytest.raises(plugin.PlugError, match="relative"):
        Family(package="bad", card_families=("bad",), loader="bad.load:load_instance")
    with pytest.raises(plugin.PlugError, match="family package"):
        Family(package="bad", card_families=("bad",), loader="vidloom.families.wan.load:load_instance")
    with pytest.raises(plugin.PlugError, match="a demo is a module"):
        Family(package="bad", card_families=("bad",), demos={"bad-demo": ".demo:ensure_demo_checkpoint"})
    with pytest.raises(ValueError, match="both cards and demos"):
        Family(package="bad", card_families=("bad",), cards={"bad-demo": ".demo:demo_card"}, demos={"bad-demo": ".demo"})


def test_conventions_fill_what_a_declaration_leaves_out():
    family = Family(package="vidloom_x.families.tiny", card_families=("tiny",), demos={"tiny-demo": ".demo"})
    assert family.name == "tiny" and family.loader == ".load:load_instance"
    assert family.card_builders == {"tiny-demo": ".demo:demo_card"}
    assert family.demo_writers == {"tiny-demo": ".demo:ensure_demo_checkpoint"}
    assert dataclasses.replace(family, name="tiny2").demos == family.demos  # the declaration is kept as written
    assert (family.capability_rows, family.parity) == (".cards:CAPABILITY_ROWS", ".parity:PARITY")


def test_plugin_resolves_absolute_and_relative_targets():
    assert plugin.resolve("vidloom.core.plugin:resolve") is plugin.resolve
    assert plugin.resolve(".plugin:resolve", "vidloom.core") is plugin.resolve
    with pytest.raises(plugin.PlugError, match="relative"):
        plugin.resolve(".plugin:resolve")
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        plugin.resolve("vidloom.core.plugin:nothing")


def test_a_family_declaration_imports_only_core():
    """`vidloom models` and the registry read every declaration: a family's __init__.py imports no network."""
    import ast

    folders = sorted((Path(registry.__file__).parent / "families").glob("*/__init__.py"))
    assert {path.parent.name for path in folders} == {f.package.rsplit(".", 1)[1] for f in registry.families()}
    for path in folders:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                assert node.module.startswith("vidloom.core"), f"{path}: imports {node.module}"
            assert not isinstance(node, ast.Import), f"{path}: imports a module"
