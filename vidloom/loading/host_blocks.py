"""Denoiser blocks held on the host while a model loads (--shard-weights): a rank's device must never hold a
denoiser whole, or a model that does not fit one device could not start on several.

Every family builds its modules through precision.materialize, and those that fill a module from a folder or a
component file move it with component_file.build_component: both ask `allocate` / `place` here. Inside
`blocks_on_host()`, a module that has blocks (`compile_units()`, the units --shard-weights shards) is allocated with
those blocks' parameters and buffers on the host and everything else on the requested device; the checkpoint fills
them where they are (safetensors are memory-mapped, so a block's bytes cross into host memory once). The sharder
(runtime.parallel.shard_weights) then slices each block on the host and moves only this rank's slice to the device.
Blocks of a module that is not sharded (a text model's layers) are moved to the device whole by `release`.
Outside the context nothing changes: `allocate` is to_empty and `place` is .to(device).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch
from torch import nn

HOST = torch.device("cpu")


class HostBlocks:
    """The blocks allocated on the host inside one `blocks_on_host()`, in build order."""

    def __init__(self) -> None:
        self.blocks: list[nn.Module] = []

    def release(self, device: torch.device, keep: set[int] = frozenset()) -> None:
        """Move every held block whose id is not in `keep` (the ones sharded: their parameters are slices now) to
        `device` whole, and the buffers of those in `keep` (sharding takes parameters only: a GGUF layer's
        quantized bytes, a block's tables)."""
        for block in self.blocks:
            if id(block) not in keep:
                block.to(device)
                continue
            for sub in block.modules():
                for name, buffer in sub._buffers.items():
                    if buffer is not None:
                        sub._buffers[name] = buffer.to(device)
        self.blocks = []


_HELD: ContextVar[HostBlocks | None] = ContextVar("vidloom_host_blocks", default=None)


@contextmanager
def blocks_on_host() -> Iterator[HostBlocks]:
    """Within: the blocks of every module materialized stay on the host (see the module docstring)."""
    held = HostBlocks()
    token = _HELD.set(held)
    try:
        yield held
    finally:
        _HELD.reset(token)


def _held_submodules(module: nn.Module) -> set[int]:
    """Ids of the submodules of `module`'s blocks, when blocks are being held and it has blocks."""
    units = getattr(module, "compile_units", None)
    if _HELD.get() is None or not callable(units):
        return set()
    return {id(sub) for block in units() for sub in block.modules()}


def allocate(module: nn.Module, device: torch.device) -> nn.Module:
    """`module.to_empty(device)`, except that held blocks' tensors are allocated on the host."""
    held, record = _held_submodules(module), _HELD.get()
    if not held or record is None:
        return module.to_empty(device=device)
    for sub in module.modules():
        sub.to_empty(device=HOST if id(sub) in held else device, recurse=False)
    record.blocks.extend(module.compile_units())
    return module


def place(module: nn.Module, device: torch.device) -> nn.Module:
    """`module.to(device)`, except that held blocks stay where they are (on the host)."""
    held = _held_submodules(module)
    if not held:
        return module.to(device)
    for sub in module.modules():
        if id(sub) not in held:
            sub._apply(lambda tensor: tensor.to(device), recurse=False)
    return module
