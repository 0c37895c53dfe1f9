"""Sharded weights (--shard-weights): each rank of a sequence-parallel group keeps 1/sp of every denoiser block's
weights and gathers a block's whole weights just before the block runs, freeing them as soon as it returns
(FSDP-style, per block, inference only).

Per block and dtype the parameters are flattened into one buffer, padded to a multiple of sp, and each rank keeps
its contiguous slice. A parameter keeps its shape while it is freed (its storage is resized to zero bytes, as
FSDP does), so code that reads shapes (LoRA's target checks, memory estimates) still sees the model it loaded.
Gathering is one all-gather per block and dtype over the sp group; every rank of that group runs the same blocks
in the same order (their attention already exchanges tokens inside every block, and a step cache's skip decision
is agreed over the group), so the collectives always pair up. Weights outside the blocks (embeddings, the head,
text encoders, the VAE) stay whole on every rank.
"""

from __future__ import annotations

import ctypes
import types
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch
from torch import Tensor, nn

from vidloom.runtime.parallel.comm import Comm


@dataclass
class _Group:
    """The parameters of one block that share a dtype, and this rank's slice of their flat buffer."""

    params: list[nn.Parameter]
    shard: Tensor
    numel: int  # the unpadded flat length


class ShardedBlock:
    """One block's weights held as this rank's slices; `gather` before its forward, `free` after."""

    def __init__(self, block: nn.Module, comm: Comm) -> None:
        self.comm = comm
        self.groups: list[_Group] = []
        by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
        for param in _own_storage_params(block):
            by_dtype.setdefault(param.dtype, []).append(param)
        for params in by_dtype.values():
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            per_rank = -(-flat.numel() // comm.size)
            padded = torch.nn.functional.pad(flat, (0, per_rank * comm.size - flat.numel()))
            shard = padded[comm.rank * per_rank:(comm.rank + 1) * per_rank].clone()
            self.groups.append(_Group(params, shard, flat.numel()))
        self.free()
        block.register_forward_pre_hook(lambda module, args: self.gather())
        block.register_forward_hook(lambda module, args, out: self.free())

    @torch.compiler.disable
    def gather(self) -> None:
        """Every rank's slices, all-gathered and copied back into the parameters' own storages."""
        for group in self.groups:
            flat = self.comm.all_gather(group.shard).reshape(-1)[:group.numel]
            offset = 0
            for param in group.params:
                count = param.numel()
                param.untyped_storage().resize_(count * param.element_size())
                with torch.no_grad():
                    param.copy_(flat[offset:offset + count].view(param.shape))
                offset += count

    def free(self) -> None:
        """Release the whole weights (the parameters keep their shapes, with zero-byte storages)."""
        for group in self.groups:
            for param in group.params:
                param.untyped_storage().resize_(0)


def shard_blocks(blocks: Iterable[nn.Module], comm: Comm) -> list[ShardedBlock]:
    """Shard every block of `blocks` over `comm` (the sp group); returns the handles (their hooks do the work)."""
    handles = [ShardedBlock(block, comm) for block in blocks]
    if any(g.shard.device.type == "cpu" for handle in handles for g in handle.groups):
        _return_freed_host_memory()
    return handles


def _return_freed_host_memory() -> None:
    """glibc keeps freed heap pages for reuse (its mmap threshold grows once large blocks are freed), so the whole
    weights just released would still count as this process's memory: hand them back to the OS (Linux, glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # another libc: its own policy applies
        pass


def resident_weight_bytes(module: nn.Module, sharded: Iterable[ShardedBlock] = ()) -> int:
    """Bytes of `module`'s weights this rank holds while no block runs: its parameters' storages (a freed block's
    are empty) plus its slices of the sharded blocks."""
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in module.parameters()}
    slices = sum(g.shard.numel() * g.shard.element_size() for block in sharded for g in block.groups)
    return sum(storages.values()) + slices


def _own_storage_params(block: nn.Module) -> list[nn.Parameter]:
    """The block's parameters, each of which must own its storage whole (no views, no weights shared with
    another parameter): freeing a storage must free exactly one parameter."""
    params = list(block.parameters())
    storages = [p.untyped_storage().data_ptr() for p in params]
    for param, pointer in zip(params, storages):
        if param.storage_offset() != 0 or storages.count(pointer) > 1 \
                or param.untyped_storage().nbytes() != param.numel() * param.element_size():
            raise ValueError(f"--shard-weights: a parameter of {type(block).__name__} {tuple(param.shape)} shares "
                             "its storage; its block cannot be sharded")
    return params


def held_weight_bytes(components: Mapping[str, Any], sharded: Iterable[ShardedBlock] = ()) -> int:
    """Bytes of weights this rank holds across an instance's components while no block runs: the parameter and buffer
    storages of every module reachable from them (modules inside wrappers such as a text encoder; an offloaded
    encoder's parameters point at its host copies), each storage once, plus its slices of the sharded blocks. Loose
    tensors (a prompt cache's embeddings) are not weights; a component another rank holds (EncoderElsewhere) has none."""
    storages: dict[tuple[str, int], int] = {}
    seen: set[int] = set()
    pending: list[Any] = list(components.values())
    while pending:
        obj = pending.pop()
        if id(obj) in seen or isinstance(obj, (Tensor, str, bytes, int, float, type, types.ModuleType)) or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, nn.Module):
            for tensor in (*obj.parameters(), *obj.buffers()):
                storage = tensor.untyped_storage()
                storages[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
            pending.extend(v for k, v in vars(obj).items() if not k.startswith("_"))  # modules held as plain attributes
        elif isinstance(obj, Mapping):
            pending.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            pending.extend(obj)
        elif hasattr(obj, "__dict__"):
            pending.extend(vars(obj).values())
    slices = sum(g.shard.numel() * g.shard.element_size() for block in sharded for g in block.groups)
    return sum(storages.values()) + slices
