"""Import direction (ARCHITECTURE, "Layers"): `core` imports nothing above it; `runtime` imports no family or server.

Read from the source with `ast`, so function-local imports count too (they are still a dependency).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vidloom"

# Package -> module prefixes it must never import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "core": ("vidloom.",),  # anything of ours outside core (checked below: vidloom.core.* is allowed)
    "runtime": ("vidloom.models", "vidloom.families", "vidloom.lora", "vidloom.serving"),
}

# Known upward imports still to remove, each with its reason; the test fails on any other one, and on an
# entry here that no longer exists (so the list only shrinks).
KNOWN: dict[tuple[str, str], str] = {
}


def _imports(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; the package uses absolute imports")
    return modules


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((PACKAGE / package).rglob("*.py")):
            for module in _imports(path):
                if package == "core" and module.startswith("vidloom.core"):
                    continue
                if module.startswith(forbidden):
                    found.add((path.relative_to(PACKAGE).as_posix(), module))
    return found


def test_no_layer_imports_upward():
    new = sorted(upward_imports() - set(KNOWN))
    assert not new, "upward imports (core must import only core; runtime no models/families/lora/serving):\n" + \
        "\n".join(f"  {path}: {module}" for path, module in new)


def test_the_known_list_only_shrinks():
    gone = sorted(set(KNOWN) - upward_imports())
    assert not gone, f"fixed, so drop them from KNOWN: {gone}"


@pytest.mark.parametrize("source, bad", [
    ("from vidloom.models.wan.transformer import WanTransformer\n", True),
    ("def f():\n    import vidloom.families.wan.loop\n", True),
    ("from vidloom.core.loop import StepPlan\nimport torch\n", False),
])
def test_the_check_sees_module_and_function_level_imports(tmp_path, source, bad):
    path = tmp_path / "x.py"
    path.write_text(source)
    hit = any(m.startswith(FORBIDDEN["runtime"]) for m in _imports(path))
    assert hit is bad


def test_every_plug_point_resolves_within_its_family():
    """Plug strings are imports the `import` check cannot see: each one a family declares (Family.plugs), and
    every "vidloom.x:attr" literal in a family's folder, resolves into that family or a shared package, never
    another family; `core` and `runtime` hold none into a family."""
    from vidloom import registry
    from vidloom.core import plugin

    plug = re.compile(r"vidloom(\.\w+)+:\w+")
    families = {family.package: family for family in registry.families() if family.package.startswith("vidloom.")}
    found: list[tuple[str, str, str]] = []  # (where, owning package or "", absolute target)
    for package, family in families.items():
        found += [(f"{package} FAMILY {where}", package, family.target(target)) for where, target in family.plugs()]
    for path in sorted(PACKAGE.rglob("*.py")):
        module = "vidloom." + path.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
        owner = next((p for p in families if module == p or module.startswith(p + ".")), None)
        if owner is None and not module.startswith(("vidloom.core.", "vidloom.runtime.")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and plug.fullmatch(node.value):
                found.append((f"{path.relative_to(PACKAGE)}:{node.lineno}", owner or "", node.value))
    assert len(found) > 100  # the declarations and the cards' program/estimator/session plugs
    crossing = [f"  {where}: {target}" for where, owner, target in found
                if target.startswith("vidloom.families.") and not (owner and target.startswith(owner + "."))]
    assert not crossing, "plug points into another family (or from core/runtime into a family):\n" + \
        "\n".join(crossing)
    for where, _, target in found:
        assert plugin.resolve(target) is not None, f"{where}: {target} resolves to None"


# Modules that import by name for a reason other than resolving a plug, each with its reason.
NAMED_IMPORTS: dict[str, str] = {
    "loading/quiet.py": "the logging module of an installed library (diffusers or transformers) to silence it",
}


def _imports_by_name(path: Path) -> bool:
    """Whether `path` calls importlib.import_module / import_module / __import__."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                return True
    return False


def test_plug_strings_have_one_resolver():
    """core/plugin.py is the one place a "module:attribute" string becomes code (so test_every_plug_point_... above
    sees every plug point); nothing else imports by name but the listed exceptions."""
    found = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py") if _imports_by_name(path)}
    assert found - {"core/plugin.py"} == set(NAMED_IMPORTS), (
        f"imports by name outside core/plugin.py (resolve plugs with vidloom.core.plugin.resolve): "
        f"{sorted(found - {'core/plugin.py'} - set(NAMED_IMPORTS))}; listed but gone: "
        f"{sorted(set(NAMED_IMPORTS) - found)}")


@pytest.mark.parametrize("source, named", [
    ("import importlib\nm = importlib.import_module('x')\n", True),
    ("from importlib import import_module\ndef f():\n    return import_module('x')\n", True),
    ("m = __import__('x')\n", True),
    ("import importlib.util\nok = importlib.util.find_spec('x')\n", False),
])
def test_the_resolver_check_sees_every_way_to_import_by_name(tmp_path, source, named):
    path = tmp_path / "x.py"
    path.write_text(source)
    assert _imports_by_name(path) is named
