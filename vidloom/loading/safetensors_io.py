"""Read and write safetensors weights (single file or sharded with an index) onto modules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from vidloom.core.errors import CheckpointError
from vidloom.loading.name_map import NameMap

DIFFUSERS_WEIGHTS = "diffusion_pytorch_model"


def weight_files(folder: Path, stem: str = DIFFUSERS_WEIGHTS) -> dict[str, Path]:
    """Map every tensor key in `folder` to the file that holds it."""
    single = folder / f"{stem}.safetensors"
    index = folder / f"{stem}.safetensors.index.json"
    if single.is_file():
        with open_safetensors(single) as f:
            return {key: single for key in f.keys()}
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc})") from None
        files = {key: folder / name for key, name in weight_map.items()}
        for path in set(files.values()):
            if not path.is_file():
                raise CheckpointError(f"{index} lists shard {path.name}, which is missing from {folder}")
        return files
    raise CheckpointError(f"{folder}: no {stem}.safetensors or {stem}.safetensors.index.json found")


def skip_prefixes(prefixes: tuple[str, ...]) -> Callable[[str], bool]:
    """A `skip` for load_weights leaving keys under any prefix (whole dotted segments) unread: parts of
    a component this runtime never runs, such as an encoder nothing encodes with."""
    return lambda key: any(key == prefix or key.startswith(prefix + ".") for prefix in prefixes)


def load_weights(
    module: torch.nn.Module,
    folder: Path,
    name_map: NameMap,
    stem: str = DIFFUSERS_WEIGHTS,
    skip: Callable[[str], bool] | None = None,
) -> None:
    """Copy every tensor of the checkpoint in `folder` into `module` through `name_map`.

    `skip(key)` True leaves a checkpoint tensor unread (weights another module of the same
    checkpoint owns, e.g. Cosmos3's generation pathways when only the understanding one is built).

    Raises CheckpointError naming the key and file for unexpected, missing or
    mis-shaped tensors. Tensors are cast to each parameter's dtype on copy.
    """
    targets = module.state_dict()
    files = weight_files(folder, stem)
    by_file: dict[Path, list[str]] = {}
    for key, path in files.items():
        by_file.setdefault(path, []).append(key)
    loaded: set[str] = set()
    for path, keys in sorted(by_file.items()):
        with open_safetensors(path) as f:
            for key in keys:
                if skip is not None and skip(key):
                    continue
                name = name_map.to_module(key)
                target = _target(targets, name, name_map)
                if target is None:
                    raise CheckpointError(f"{path}: unexpected tensor {key!r} (no parameter {name!r} in {type(module).__name__})")
                tensor = read_tensor(f, path, key)
                if tuple(tensor.shape) != tuple(target.shape):
                    raise CheckpointError(
                        f"{path}: tensor {key!r} has shape {tuple(tensor.shape)}, "
                        f"{type(module).__name__}.{name} expects {tuple(target.shape)}"
                    )
                with torch.no_grad():
                    target.copy_(tensor)
                loaded.add(name)
    missing = [name_map.to_checkpoint(part) for name, target in targets.items() if name not in loaded
               for part in (stacked_rows(name_map, name, target) or (name,)) if part not in loaded]
    if missing:
        shown = ", ".join(repr(k) for k in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"{folder}: missing tensors {shown}{more} for {type(module).__name__}")


def stacked_rows(name_map: NameMap, name: str, target: torch.Tensor) -> tuple[str, ...] | None:
    """The row names `name.0`, `name.1`, ... of a stacked parameter (mixture-of-experts weights kept as one
    [experts, ...] tensor), when a rule of `name_map` gives its rows checkpoint keys of their own (one tensor per
    expert on disk); None for an ordinary parameter."""
    if target.dim() < 2:
        return None
    row = f"{name}.0"
    if name_map.to_checkpoint(row) == name_map.to_checkpoint(name) + ".0":
        return None
    return tuple(f"{name}.{i}" for i in range(target.shape[0]))


def _target(targets: dict[str, torch.Tensor], name: str, name_map: NameMap) -> torch.Tensor | None:
    """The tensor `name` loads into: a parameter, or row i of a stacked one (`param.{i}`, where a rule of
    `name_map` gives the rows keys of their own: stacked_rows)."""
    if name in targets:
        return targets[name]
    base, _, index = name.rpartition(".")
    stacked = targets.get(base)
    if (index.isdigit() and stacked is not None and stacked_rows(name_map, base, stacked) is not None
            and int(index) < stacked.shape[0]):
        return stacked[int(index)]
    return None


def checkpoint_state(module: torch.nn.Module, name_map: NameMap) -> dict[str, torch.Tensor]:
    """`module`'s tensors in checkpoint naming; a stacked parameter is written one row per key (`stacked_rows`)."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in module.state_dict().items():
        rows = stacked_rows(name_map, name, tensor)
        parts = zip(rows, tensor.unbind(0)) if rows is not None else ((name, tensor),)
        state.update((name_map.to_checkpoint(part), value.detach().contiguous()) for part, value in parts)
    return state


def save_weights(
    module: torch.nn.Module,
    folder: Path,
    name_map: NameMap,
    stem: str = DIFFUSERS_WEIGHTS,
    max_shard_bytes: int | None = None,
) -> None:
    """Write `module`'s state in checkpoint naming; shard with an index past `max_shard_bytes`."""
    folder.mkdir(parents=True, exist_ok=True)
    state = checkpoint_state(module, name_map)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(folder / f"{stem}.safetensors"))
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / name))
        weight_map.update({key: name for key in shard})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())}, "weight_map": weight_map}
    (folder / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2))


def open_safetensors(path: Path) -> Any:
    """safe_open, with a truncated or corrupt file reported as CheckpointError naming it."""
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc}); download it again") from None


def read_tensor(handle: Any, path: Path, key: str) -> torch.Tensor:
    try:
        return handle.get_tensor(key)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path}: cannot read tensor {key!r} ({exc}); the file may be truncated") from None
