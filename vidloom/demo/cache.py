"""Writing a family's demo checkpoint into the user's cache: once, atomically, from seeded random weights.

Every `*-demo` card is the real architecture at a tiny size. Its folder is written in the family's
diffusers layout with our own modules (diffusers is a test dependency only), so loading it goes
through the same reader as a real checkpoint. These helpers, writer.py's parts and
tokenizer.py's tokenizers are what every family's writer shares.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from safetensors.torch import save_file

from vidloom.core.errors import CheckpointError
from vidloom.loading.name_map import NameMap
from vidloom.loading.safetensors_io import DIFFUSERS_WEIGHTS, checkpoint_state

NOISE_NOTE = (
    "{demo} has RANDOM weights (the real {family} architecture at a tiny size{runner}): its output is noise by "
    "design; it exists so every {family} feature runs offline on a CPU. For real output pass real {family} "
    "weights with --model (a {layout} checkpoint directory or Hub repo id{example})."
)


def noise_note(demo: str, family: str, example: str = "", *, layout: str = "diffusers", runner: str = "") -> str:
    """The card note every demo carries: its output is noise, and where real weights come from (`layout`: the
    checkpoint format the family reads; `runner`: who runs it, where that is not vidloom's own modules)."""
    return NOISE_NOTE.format(demo=demo, family=family, example=f", e.g. {example}" if example else "",
                             layout=layout, runner=f", {runner}" if runner else "")


@dataclass(frozen=True)
class DemoCheckpoint:
    """A demo's entry in the cache: `<demo_id>-v<version>`, filled by `write` (bump the version when the
    demo's architecture or files change, so caches holding the old folder write the new one)."""

    demo_id: str
    version: int
    write: Callable[[Path], None]
    marker: str = "model_index.json"  # a file every complete folder has

    def ensure(self, cache_dir: Path) -> Path:
        """The demo's folder in `cache_dir`, written first if absent."""
        return ensure_written(cache_dir, f"{self.demo_id}-v{self.version}", self.write, self.marker)


def ensure_written(cache_dir: Path, name: str, write: Callable[[Path], None],
                   marker: str = "model_index.json") -> Path:
    """`cache_dir/name`, written by `write(folder)` first if this cache has none (`marker`: a file every
    complete folder has; a transformers checkpoint's is config.json).

    The folder appears with all its files or not at all (staged, then renamed), so a reader never
    sees a half-written demo and two processes writing at once both end with the same folder.
    """
    target = cache_dir / name
    if (target / marker).is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache_dir))
    try:
        write(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / marker).is_file():  # not a concurrent writer's win
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def fill_zeros(module: torch.nn.Module, std: float = 0.02) -> None:
    """Give zero-initialised parameters small noise.

    Zero output projections and modulation tables would make a random network predict a constant;
    small noise keeps every layer exercised.
    """
    with torch.no_grad():
        for param in module.parameters():
            if not param.any():
                param.normal_(0.0, std)


def save_merged(folder: Path, parts: Iterable[tuple[torch.nn.Module, NameMap]], stem: str = DIFFUSERS_WEIGHTS) -> None:
    """Write several modules that one checkpoint folder holds (e.g. Cosmos3's understanding and generation
    pathways share transformer/) as one safetensors file in checkpoint naming."""
    state: dict[str, torch.Tensor] = {}
    for module, name_map in parts:
        for key, tensor in checkpoint_state(module, name_map).items():
            if key in state:
                raise CheckpointError(f"{folder}: two modules write tensor {key!r}")
            state[key] = tensor
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / f"{stem}.safetensors"))


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
