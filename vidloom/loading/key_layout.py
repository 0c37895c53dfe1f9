"""Original (non-diffusers) key layouts of single-file checkpoints, as data, and the row ops they need.

A KeyLayout turns one key of an original release (Wan-AI, BFL, Lightricks) or of a ComfyUI export of it into the
diffusers key(s) the component's NameMap already reads: wrapper prefixes are stripped, prefix rules rename, whole
dotted segments rename, fused tensors are split by rows and swapped halves are put back. The row ops take plain
tensors and quantized weights alike (anything with `split_rows` / `cat_rows`), so a GGUF file in an original
layout converts the same way as a safetensors one, without dequantizing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

import torch

from vidloom.core.errors import CheckpointError
from vidloom.loading.name_map import NameMap

T = TypeVar("T")


def split_rows(tensor: Any, sizes: Sequence[int]) -> list[Any]:
    """Split along dim 0 (a linear's output rows); a quantized weight splits itself whole blocks at a time."""
    if hasattr(tensor, "split_rows"):
        return list(tensor.split_rows(list(sizes)))
    return list(torch.split(tensor, list(sizes), dim=0))


def cat_rows(parts: Sequence[Any]) -> Any:
    """Concatenate along dim 0; quantized weights through their own `cat_rows`."""
    if hasattr(parts[0], "cat_rows"):
        return type(parts[0]).cat_rows(list(parts))
    return torch.cat(list(parts), dim=0)


def swap_halves(tensor: Any) -> Any:
    """(a, b) -> (b, a) along dim 0: BFL stores the final modulation as (shift, scale), diffusers as (scale, shift)."""
    first, second = split_rows(tensor, [tensor.shape[0] // 2] * 2)
    return cat_rows([second, first])


@dataclass(frozen=True)
class RowSplit:
    """An original fused tensor (prefix `fused`) whose rows are the diffusers tensors `parts`, equal sizes, in order."""

    fused: str
    parts: tuple[str, ...]
    _maps: tuple[NameMap, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_maps", tuple(NameMap(((self.fused, part),)) for part in self.parts))

    def targets(self, key: str) -> tuple[str, ...] | None:
        """The diffusers keys `key` splits into, or None when it is not this fused tensor."""
        names = tuple(m.to_module(key) for m in self._maps)
        return None if names[0] == key else names


@dataclass(frozen=True)
class KeyLayout:
    """One original layout of a component's weights.

    `markers`: keys (wrapper prefixes stripped) that only this layout has; one present selects it.
    `prefixes`: wrappers stripped first (ComfyUI's and LTX-2's `model.diffusion_model.`). With `only_prefixed`,
    keys under none of them belong to another component stored in the same file (LTX-2's single file holds
    the VAEs and the vocoder too) and are skipped. `dropped`: prefixes (after stripping) of weights another
    component owns. `renames`: original -> diffusers prefix rules; `segments`: whole dotted segments renamed
    wherever they occur, after `renames`. `splits` / `swapped`: row ops, matched on the original key.
    """

    name: str
    markers: tuple[str, ...]
    renames: NameMap = NameMap(())
    segments: tuple[tuple[str, str], ...] = ()
    prefixes: tuple[str, ...] = ()
    only_prefixed: bool = False
    dropped: tuple[str, ...] = ()
    splits: tuple[RowSplit, ...] = ()
    swapped: tuple[str, ...] = ()

    def strip(self, key: str) -> str | None:
        """`key` without its wrapper prefix; None when it belongs to another component of the file."""
        for prefix in self.prefixes:
            if key.startswith(prefix):
                return key[len(prefix):]
        return None if self.only_prefixed else key

    def matches(self, keys: Sequence[str]) -> bool:
        stripped = {self.strip(k) for k in keys}
        return any(marker in stripped for marker in self.markers)

    def convert(self, key: str, read: Callable[[], T]) -> list[tuple[str, T]]:
        """The diffusers (key, tensor) pairs original `key` becomes; `read` runs only for keys this component owns."""
        inner = self.strip(key)
        if inner is None or _under(inner, self.dropped):
            return []
        for split in self.splits:
            names = split.targets(inner)
            if names is not None:
                tensor = read()
                rows = int(tensor.shape[0])
                if rows % len(names):
                    raise CheckpointError(f"tensor {key!r} has {rows} rows, which do not split into the "
                                          f"{len(names)} equal parts {', '.join(names)}")
                return list(zip(names, split_rows(tensor, [rows // len(names)] * len(names))))
        tensor = read()
        if _under(inner, self.swapped):
            tensor = swap_halves(tensor)
        return [(self.rename(inner), tensor)]

    def rename(self, inner: str) -> str:
        renamed = self.renames.to_module(inner)
        if not self.segments:
            return renamed
        table = dict(self.segments)
        return ".".join(table.get(part, part) for part in renamed.split("."))


def _under(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)
