"""Cast a loaded module to its compute dtype, keeping precision-sensitive parts in float32."""

from __future__ import annotations

from typing import Callable

import torch


def cast_module(module: torch.nn.Module, dtype: torch.dtype, keep_fp32: frozenset[str] = frozenset()) -> torch.nn.Module:
    """Cast floating parameters/buffers to `dtype`, except those with a name segment in `keep_fp32`.

    Mirrors diffusers' `_keep_in_fp32_modules`, so bf16 runs match the reference.
    """
    module.to(dtype)
    if dtype == torch.float32 or not keep_fp32:
        return module
    for name, param in module.named_parameters():
        if keep_fp32.intersection(name.split(".")):
            param.data = param.data.float()
    return module


def materialize(
    build: Callable[[], torch.nn.Module],
    device: torch.device,
    dtype: torch.dtype,
    keep_fp32: frozenset[str] = frozenset(),
) -> torch.nn.Module:
    """Build a module on the meta device, cast it, then allocate it (uninitialised) on `device`.

    Skips random init and any full-precision copy: the checkpoint fills every tensor
    next. Modules with non-persistent buffers can't be built this way (nothing would
    fill them), so they are refused.
    """
    with torch.device("meta"):
        module = build()
    persistent = set(module.state_dict())
    derived = [name for name, _ in module.named_buffers() if name not in persistent]
    if derived:
        raise TypeError(f"{type(module).__name__} has non-persistent buffers {derived[:3]}; build it eagerly")
    return cast_module(module, dtype, keep_fp32).to_empty(device=device)
