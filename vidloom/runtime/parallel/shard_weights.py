"""Sharded weights (--shard-weights): each rank of a sequence-parallel group keeps 1/sp of every denoiser block's
weights and gathers a block's whole weights just before the block runs, freeing them as soon as it returns
(FSDP-style, per block, inference only).

Per block and dtype the parameters are flattened into one buffer, padded to a multiple of sp, and each rank keeps
its contiguous slice. A parameter keeps its shape while it is freed (its storage is resized to zero bytes, as
FSDP does), so code that reads shapes (LoRA's target checks, memory estimates) still sees the model it loaded.
Gathering is one all-gather per block and dtype over the sp group; every rank of that group runs the same blocks
in the same order (their attention already exchanges tokens inside every block, and a step cache's skip decision
is agreed over the group), so the collectives always pair up; work that reads a block's weights outside its
forward (a prompt's K/V prepared once per request) gathers them through layers.sharded.resident. Weights outside
the blocks (embeddings, the head, text encoders, the VAE) stay whole on every rank.
"""

from __future__ import annotations

import ctypes
import types
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch
from torch import Tensor, nn

from vidloom.layers.sharded import mark_sharded
from vidloom.runtime.parallel.comm import Comm


@dataclass
class _Group:
    """The parameters of one block that share a dtype, and this rank's slice of their flat buffer."""

    params: list[nn.Parameter]
    shard: Tensor
    numel: int  # the unpadded flat length


class ShardedBlock:
    """One block's weights held as this rank's slices; `gather` before its forward, `free` after."""

    def __init__(self, block: nn.Module, comm: Comm, device: torch.device | None = None) -> None:
        """`device`: where the slice and the gathered weights live; a block still held on the host
        (loading.host_blocks) is sliced there and only its slice moves (None: where the block's parameters are)."""
        self.comm = comm
        self.block = block
        self.groups: list[_Group] = []
        by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
        for param in _own_storage_params(block):
            by_dtype.setdefault(param.dtype, []).append(param)
        for params in by_dtype.values():
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            per_rank = -(-flat.numel() // comm.size)
            padded = torch.nn.functional.pad(flat, (0, per_rank * comm.size - flat.numel()))
            target = flat.device if device is None else device
            shard = padded[comm.rank * per_rank:(comm.rank + 1) * per_rank].to(target, copy=True)
            numel = flat.numel()
            del flat, padded
            self.groups.append(_Group(params, shard, numel))
        names = [_names(block, group.params) for group in self.groups]
        _drop_whole_copies(block, {id(p) for group in self.groups for p in group.params},
                           self.groups[0].shard.device if self.groups else device)
        for group, group_names in zip(self.groups, names):  # a parameter _drop_whole_copies replaced: the new one
            group.params = [block.get_parameter(name) for name in group_names]
        self.free()
        mark_sharded(block, self)  # layers.sharded.resident gathers it for work outside its forward (prompt K/V)
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


def shard_blocks(blocks: Iterable[nn.Module], comm: Comm, device: torch.device | None = None) -> list[ShardedBlock]:
    """Shard every block of `blocks` over `comm` (the sp group); returns the handles (their hooks do the work).

    `device`: where the slices go (see ShardedBlock); blocks held on the host reach it one slice at a time."""
    handles = []
    for block in blocks:
        on_host = any(p.device.type == "cpu" for p in block.parameters())
        handles.append(ShardedBlock(block, comm, device))
        if on_host:  # this block's whole host copy is gone: give its pages back before the next one is sliced
            _return_freed_host_memory()
    return handles


def _drop_whole_copies(block: nn.Module, params: set[int], device: torch.device | None) -> None:
    """Give each of `params` an empty storage on `device`, its shape kept: the whole copy (on the host when loading
    held it there) is released. A parameter whose tensor type cannot take the new data in place (host to the meta
    device) is replaced in its module by a new Parameter."""
    for module in block.modules():
        for name, param in list(module._parameters.items()):
            if param is None or id(param) not in params:
                continue
            empty = _empty_like_on(param, device)
            if torch._has_compatible_shallow_copy_type(param, empty):
                param.data = empty
            else:
                module._parameters[name] = nn.Parameter(empty, requires_grad=param.requires_grad)


def _names(block: nn.Module, params: list[nn.Parameter]) -> list[str]:
    by_id = {id(p): name for name, p in block.named_parameters(remove_duplicate=False)}
    return [by_id[id(p)] for p in params]


def _empty_like_on(param: Tensor, device: torch.device) -> Tensor:
    """A tensor of `param`'s shape, dtype and strides on `device` whose storage holds zero bytes (set_ sizes the
    storage for the shape, so it is emptied at once: one parameter's bytes at most, for an instant)."""
    empty = torch.empty(0, dtype=param.dtype, device=device)
    empty.set_(torch.UntypedStorage(0, device=device), 0, param.shape, param.stride())
    empty.untyped_storage().resize_(0)
    return empty


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
