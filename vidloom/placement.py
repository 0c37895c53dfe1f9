"""Where a model runs: the device and dtype a caller asked for, checked, and the card and checkpoint it names."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom import registry
from vidloom.core.card import ModelCard
from vidloom.core.errors import DeployError

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """None -> CUDA when available, else CPU; a device that does not exist here raises DeployError."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeployError(f"device: {device!r} is not a device ({exc}); use cuda, cuda:N or cpu") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise DeployError(f"device: {device!r} asked for CUDA, but this PyTorch sees no CUDA device; use cpu")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise DeployError(f"device: {device!r} does not exist; {torch.cuda.device_count()} CUDA device(s) here")
    elif resolved.type != "cpu":
        raise DeployError(f"device: {device!r} is not supported; use cuda, cuda:N or cpu")
    return resolved


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None:
        return None
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise DeployError(f"dtype: {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
        return DTYPES[dtype]
    if dtype not in DTYPES.values():
        raise DeployError(f"dtype: {dtype} is not supported; use one of {', '.join(DTYPES)}")
    return dtype


def resolve_model(
    model: str | Path, device: str | torch.device | None, dtype: torch.dtype | str | None, cache_dir: str | Path | None
) -> tuple[ModelCard, Path, torch.device, torch.dtype | None]:
    resolved_device, resolved_dtype = resolve_device(device), resolve_dtype(dtype)
    card = registry.resolve_card(model)
    checkpoint = registry.resolve_checkpoint(card, Path(cache_dir) if cache_dir else None)
    return card, checkpoint, resolved_device, resolved_dtype
