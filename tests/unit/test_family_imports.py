"""A family is one folder (#34): no family imports another, and the shared packages import no family.

What two families use lives in a shared place (`layers/`, `models/`, `text_encoders/`, `loading/`, `diffusion/`),
never in one of them. Read from the source with `ast`, as test_layers does, so function-local imports count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vidloom"
FAMILY_PREFIX = "vidloom.families"
# The packages families build on; none of them may import a family.
SHARED = ("core", "runtime", "layers", "models", "diffusion", "loading", "text_encoders", "decoding")


def imported_modules(path: Path) -> list[str]:
    """Every module `path` imports, at any depth. `from a.b import c` names `a.b.c` when c is a module of ours
    (`from vidloom.families import wan`), else `a.b`."""
    modules = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; the package uses absolute imports")
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules += [_submodule(node.module, alias.name) for alias in node.names]
    return modules


def _submodule(module: str, name: str) -> str:
    candidate = ROOT.joinpath(*module.split("."), name)
    return f"{module}.{name}" if candidate.with_suffix(".py").is_file() or candidate.is_dir() else module


def _is_family(module: str) -> bool:
    return module == FAMILY_PREFIX or module.startswith(FAMILY_PREFIX + ".")


def imports_between_families(families: Path) -> set[tuple[str, str]]:
    """(path under the package, module) for each import of `families/<b>` by a module of `families/<a>`, a != b."""
    found = set()
    for path in sorted(families.rglob("*.py")):
        inside = path.relative_to(families)
        if len(inside.parts) < 2:  # families/__init__.py: the family list, not a family
            continue
        for module in imported_modules(path):
            parts = module.split(".")
            if _is_family(module) and len(parts) > 2 and parts[2] != inside.parts[0]:
                found.add((f"families/{inside.as_posix()}", module))
    return found


def family_imports_in_shared(package: Path) -> set[tuple[str, str]]:
    """(path under the package, module) for each import of a family by a module of a SHARED package."""
    found = set()
    for shared in SHARED:
        for path in sorted((package / shared).rglob("*.py")):
            found |= {(path.relative_to(package).as_posix(), m) for m in imported_modules(path) if _is_family(m)}
    return found


def _listed(found: set[tuple[str, str]]) -> str:
    return "".join(f"\n  {path}: {module}" for path, module in sorted(found))


def test_no_family_imports_another():
    found = imports_between_families(PACKAGE / "families")
    assert not found, "imports between families (move what both use to a shared package):" + _listed(found)


def test_no_shared_package_imports_a_family():
    found = family_imports_in_shared(PACKAGE)
    assert not found, "shared packages importing a family (families plug in through their FAMILY):" + _listed(found)


@pytest.mark.parametrize("source, between_families, in_shared", [
    ("from vidloom.families.wan.text import EmbeddingCache\n", True, True),
    ("def load():\n    import vidloom.families.cosmos3.load\n", True, True),  # function-local
    ("from vidloom.families import wan\n", True, True),
    ("from vidloom.families.flux2.text import Flux2TextEncoder\n", False, True),  # flux2's own module
    ("from vidloom.text_encoders.prompt_cache import EmbeddingCache\n", False, False),
])
def test_the_check_catches_a_planted_import(tmp_path, source, between_families, in_shared):
    for where in ("families/flux2", "layers"):
        (tmp_path / where).mkdir(parents=True)
        (tmp_path / where / "planted.py").write_text(source)
    assert bool(imports_between_families(tmp_path / "families")) is between_families
    assert bool(family_imports_in_shared(tmp_path)) is in_shared


def test_the_check_refuses_a_relative_import(tmp_path):
    planted = tmp_path / "families" / "flux2" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from ..wan import text\n")
    with pytest.raises(AssertionError, match="relative import"):
        imports_between_families(tmp_path / "families")
