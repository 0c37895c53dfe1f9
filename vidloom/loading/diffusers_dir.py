"""A diffusers-format checkpoint directory: model_index.json plus one subfolder per component."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TypeVar

from vidloom.core.errors import CheckpointError
from vidloom.loading.key_policy import KeyPolicy, reading_file

T = TypeVar("T")


@dataclass(frozen=True)
class DiffusersDir:
    """Validated view of a checkpoint directory; reading configs names the file on error."""

    root: Path
    index: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path) -> "DiffusersDir":
        root = Path(path).expanduser()
        if not root.is_dir():
            raise CheckpointError(f"checkpoint directory {root} does not exist")
        index_file = root / "model_index.json"
        if not index_file.is_file():
            raise CheckpointError(f"{root} is not a diffusers checkpoint: model_index.json is missing")
        return cls(root, read_json(index_file))

    @classmethod
    def open_checked(cls, path: str | Path, check: Callable[["DiffusersDir"], None],
                     components: Iterable[str]) -> "DiffusersDir":
        """The folder at `path` once `check` (its family's pipeline and index check) passes and it holds a folder
        for each of `components` (a card's)."""
        ckpt = cls.open(path)
        check(ckpt)
        ckpt.require(components)
        return ckpt

    @property
    def pipeline_class(self) -> str:
        return str(self.index.get("_class_name", ""))

    def expect_pipeline(self, *classes: str) -> None:
        """Refuse a folder whose model_index.json names a pipeline class other than `classes`."""
        if self.pipeline_class not in classes:
            expected = repr(classes[0]) if len(classes) == 1 else f"one of {', '.join(classes)}"
            raise CheckpointError(f"{self.root}: model_index.json says {self.pipeline_class!r}, expected {expected}")

    def component_dir(self, name: str) -> Path:
        """Folder of component `name`; raises CheckpointError if absent."""
        if name not in self.index:
            raise CheckpointError(f"{self.root}/model_index.json lists no component {name!r}")
        folder = self.root / name
        if not folder.is_dir():
            raise CheckpointError(f"{self.root}: component folder {name!r} is missing")
        return folder

    def require(self, names: Iterable[str]) -> None:
        """Every component a card declares must be a folder here; the error lists all that are missing."""
        missing = [name for name in names if not (self.root / name).is_dir()]
        if missing:
            raise CheckpointError(f"{self.root}: missing component folder(s) {', '.join(missing)} "
                                  f"(a diffusers checkpoint has one folder per component)")

    def has(self, name: str) -> bool:
        """Whether model_index.json lists `name` with a class (diffusers writes [null, null] for an absent one)."""
        entry = self.index.get(name)
        return isinstance(entry, list) and bool(entry) and entry[0] is not None

    def check_index(self, components: Iterable[str], settings: Iterable[str] = (),
                    unsupported: Mapping[str, str] | None = None) -> None:
        """Every model_index.json key is a component or pipeline setting the loader knows; an `unsupported`
        component (name -> why) is refused when the index lists it with a class. Errors name key and file."""
        unsupported = unsupported or {}
        where = f"{self.root}/model_index.json"
        self._refuse_fastvideo_layout(where)
        KeyPolicy(frozenset((*components, *settings, *unsupported))).check(self.index, where)
        for name, why in unsupported.items():
            if self.has(name):
                raise CheckpointError(f"{where}: component {name!r} is not supported ({why})")

    def _refuse_fastvideo_layout(self, where: str) -> None:
        """FastVideo's converters write folders with a diffusers-looking model_index.json whose components are
        FastVideo's own classes and tensor names (e.g. its Stable Audio repos: ["fastvideo.models.dits...",
        "StableAudioDiT"]); name that instead of the first key our readers do not know."""
        own = [f"{name}: {entry[0]}.{entry[1]}" for name, entry in self.index.items()
               if isinstance(entry, list) and len(entry) == 2 and str(entry[0]).startswith("fastvideo")]
        if own or "_fastvideo_converted_from" in self.index:
            shown = ", ".join(own) or "_fastvideo_converted_from"
            raise CheckpointError(f"{where}: a FastVideo-native layout ({shown}), not a diffusers folder; load the "
                                  f"diffusers repo it was converted from")

    def component_config(self, name: str, filename: str = "config.json") -> dict[str, Any]:
        return read_json(self.component_dir(name) / filename)

    def parse_component(self, name: str, parse: Callable[[dict[str, Any]], T], filename: str = "config.json") -> T:
        """`parse` of component `name`'s config; an error it raises (CheckpointError, ValueError) names the file."""
        path = self.component_dir(name) / filename
        cfg = read_json(path)
        try:
            with reading_file(path):
                return parse(cfg)
        except (CheckpointError, ValueError) as exc:
            raise CheckpointError(f"{path}: {exc}") from None


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data
