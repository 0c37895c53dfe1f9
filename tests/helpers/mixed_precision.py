"""diffusers' float32 islands: which tensors a bf16 load keeps in float32, and a cast that keeps them there."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def fp32_islands(model: torch.nn.Module, keep_fp32: Iterable[str]) -> set[str]:
    """State-dict keys with a name segment in `keep_fp32` (diffusers' `_keep_in_fp32_modules` rule)."""
    keep = set(keep_fp32)
    return {name for name in model.state_dict() if any(segment in keep for segment in name.split("."))}


def cast_mixed(model: torch.nn.Module, keep_fp32: Iterable[str]) -> None:
    """bf16 everywhere except tensors with a name segment in keep_fp32 (diffusers' from_pretrained rule)."""
    keep = set(keep_fp32)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        kept = any(segment in keep for segment in name.split("."))
        tensor.data = tensor.data.to(torch.float32 if kept else torch.bfloat16)
