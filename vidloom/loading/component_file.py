"""Component overrides: one component's weights from a single .safetensors or .gguf file.

The checkpoint folder still gives every config and every other component; the file replaces only the weights.
Its key layout is detected: diffusers keys (read through the component's NameMap as from a folder) or one of the
original layouts the family declares (key_layout.KeyLayout). FP8 single files are dequantized to the compute dtype
as they are copied in (loading.scaled_fp8 states the rule). GGUF weights stay quantized (vidloom.layers.gguf_linear).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch

from vidloom.core.deploy import COMPONENT_FILE_SUFFIXES
from vidloom.core.errors import CheckpointError, DeployError
from vidloom.loading.host_blocks import place
from vidloom.loading.key_layout import KeyLayout
from vidloom.loading.name_map import NameMap
from vidloom.loading.precision import materialize
from vidloom.loading.safetensors_io import load_weights, open_safetensors, read_tensor
from vidloom.loading.scaled_fp8 import FP8_DTYPES, dequantize, scale_key, weight_keys


def component_files(overrides: Sequence[tuple[str, str]], readable: Iterable[str], where: str) -> dict[str, Path]:
    """The override files by component, checked before anything loads.

    `readable`: the components this checkpoint's loader reads a file for. A name outside it is a DeployError
    listing them; a file that is not there is a CheckpointError naming it.
    """
    known = tuple(readable)
    files: dict[str, Path] = {}
    for name, given in overrides:
        if name not in known:
            raise DeployError(f"components (--component {name}=...): {where} reads no file for component {name!r}; "
                              f"it takes one for: {', '.join(known)}")
        path = Path(given).expanduser()
        if not path.is_file():
            raise CheckpointError(f"components (--component {name}=...): {path} does not exist")
        files[name] = path
    return files


def build_component(build: Callable[[], torch.nn.Module], folder: Path, name_map: NameMap, file: Path | None,
                    layouts: tuple[KeyLayout, ...], device: torch.device, dtype: torch.dtype,
                    keep_fp32: frozenset[str] = frozenset()) -> torch.nn.Module:
    """`build()` materialized in `dtype` (precision.materialize), filled from its `folder` or the override `file`
    (load_component), on `device`.

    A GGUF file's module is built on the CPU and moved after filling: a module is allocated full size before its
    weights are read; on the CPU those untouched pages never become resident, and the linears the file swaps for
    quantized ones free theirs, so only the quantized bytes and the small plain tensors reach `device`. Built on
    CUDA, the full-size weights would be allocated first - the very memory GGUF is used to avoid."""
    staged = torch.device("cpu") if file is not None and file.suffix.lower() == ".gguf" else device
    module = materialize(build, staged, dtype, keep_fp32)
    load_component(module, folder, name_map, file, layouts)
    return place(module, device)  # a held denoiser's blocks stay on the host (loading.host_blocks)


def load_component(module: torch.nn.Module, folder: Path, name_map: NameMap, file: Path | None = None,
                   layouts: tuple[KeyLayout, ...] = ()) -> None:
    """Fill `module` from its checkpoint `folder`, or from `file` when the deployment overrides it."""
    if file is None:
        load_weights(module, folder, name_map)
    else:
        load_component_file(module, file, name_map, layouts)


def load_component_file(module: torch.nn.Module, path: Path, name_map: NameMap,
                        layouts: tuple[KeyLayout, ...] = ()) -> None:
    """Copy every tensor of the single file `path` into `module`, converting an original layout on the way.

    Raises CheckpointError naming the file and the first tensor that is unexpected, mis-shaped, unreadable or
    missing, with the layout it was read in, before the module is used.
    """
    targets = module.state_dict()
    owner = type(module).__name__
    with open_tensors(path) as source:
        keys = source.keys
        layout = next((layout for layout in layouts if layout.matches(keys)), None)
        described = layout.name if layout else _diffusers_layout(layouts)
        loaded: set[str] = set()
        for key in keys:
            try:
                pairs = layout.convert(key, lambda: source[key]) if layout else [(key, source[key])]
            except CheckpointError as exc:
                raise CheckpointError(f"{path}: {exc}") from None
            for diffusers_key, tensor in pairs:
                name = name_map.to_module(diffusers_key)
                if name not in targets:
                    raise CheckpointError(f"{path}: unexpected tensor {key!r} for {owner} (read in the {described}; "
                                          f"no parameter {name!r}): is this file for another model or component?")
                _check_storage(tensor, targets[name], path, key)
                _install(module, targets[name], name, tensor, path, key)
                loaded.add(name)
    missing = [name_map.to_checkpoint(name) for name in targets if name not in loaded]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CheckpointError(f"{path}: missing tensor {missing[0]!r}{more} for {owner} (read in the {described})")


def _install(module: torch.nn.Module, target: torch.Tensor, name: str, tensor: Any, path: Path, key: str) -> None:
    if tuple(tensor.shape) != tuple(target.shape):
        raise CheckpointError(f"{path}: tensor {key!r} has shape {tuple(tensor.shape)}, "
                              f"{type(module).__name__}.{name} expects {tuple(target.shape)}")
    if not isinstance(tensor, torch.Tensor):  # GGUF: a Linear's weight stays quantized, anything else is dequantized
        from vidloom.layers.gguf_linear import place_quantized

        place_quantized(module, name, tensor, target)
        return
    with torch.no_grad():
        target.copy_(tensor)


def _check_storage(tensor: Any, target: torch.Tensor, path: Path, key: str) -> None:
    """Integer storage for a float parameter is a quantization format we do not read (int8 block-wise, NVFP4
    packed in uint8, ...): copying it would cast the codes as if they were values."""
    if isinstance(tensor, torch.Tensor) and target.is_floating_point() and not tensor.is_floating_point():
        raise CheckpointError(f"{path}: tensor {key!r} is stored as {tensor.dtype} (a quantized format vidloom does "
                              f"not read); use a float, FP8-with-scales or GGUF file")


def _diffusers_layout(layouts: tuple[KeyLayout, ...]) -> str:
    if not layouts:
        return "diffusers layout"
    return f"diffusers layout (no key of the {' or '.join(layout.name for layout in layouts)} was found)"


class _Tensors:
    """Tensors of one file by key, read on access; FP8 weights come back dequantized with their scale."""

    def __init__(self, keys: Iterable[str], read: Callable[[str], Any]) -> None:
        self._present = set(keys)
        self.keys = weight_keys(keys)
        self._read = read

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys)

    def __getitem__(self, key: str) -> Any:
        tensor = self._read(key)
        if isinstance(tensor, torch.Tensor) and tensor.dtype in FP8_DTYPES:
            scale = scale_key(key, self._present)
            return dequantize(key, tensor, lambda: None if scale is None else self._read(scale))
        return tensor


@contextmanager
def open_tensors(path: Path) -> Iterator[_Tensors]:
    """A single component file by suffix: safetensors (lazy, memory-mapped) or GGUF (vidloom.loading.gguf_file)."""
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        with open_safetensors(path) as handle:
            yield _Tensors(list(handle.keys()), lambda key: read_tensor(handle, path, key))
        return
    if suffix == ".gguf":
        from vidloom.loading.gguf_file import read_gguf

        tensors: Mapping[str, Any] = read_gguf(path)
        yield _Tensors(list(tensors), tensors.__getitem__)
        return
    raise CheckpointError(f"{path}: unsupported component file type {suffix!r}; one of "
                          f"{', '.join(COMPONENT_FILE_SUFFIXES)}")
