"""--text-encoder-rank: one rank runs the prompt nodes and broadcasts what they write; the others receive it.

The owning rank runs each prompt node as one device would (its prompt cache and offloaded encoder included) and
sends the slots the node wrote; every other rank skips the node and takes the same values, bitwise equal, so the
rest of the program runs as if each rank had encoded the prompt itself. A node writes any nest of tensors, None,
numbers, strings, tuples, lists, dicts and dataclasses: the nest, with each tensor's shape and dtype in its place,
goes as one pickled object over the world group, then each tensor by one broadcast on the group's own device (NCCL:
the GPU, gloo: the CPU; a tensor elsewhere travels inside the pickle). A failure on the owner (an InvalidRequest for
a prompt too long) travels too and every rank raises it, so the pool sees an error of the request, not of a rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.errors import DeployError
from vidloom.core.program import Node, NodeContext, Program
from vidloom.runtime.parallel.comm import BroadcastComm
from vidloom.runtime.parallel.messages import RankFailure


def encode_on_one_rank(program: Program, prompt_nodes: tuple[str, ...], owner: int, world: BroadcastComm,
                       device: torch.device) -> Program:
    """`program` with each of `prompt_nodes` run on rank `owner` of `world` alone and broadcast to the others;
    tensors on `device` (the one the group's backend carries: NCCL the rank's GPU, gloo the CPU) go by broadcast."""
    found = [node.name for node in program.nodes if node.name in prompt_nodes and node.run is not None]
    if not found:
        raise DeployError(f"parallel.text_encoder_rank (--text-encoder-rank): this model's program has no prompt "
                          f"node ({', '.join(prompt_nodes) or 'none declared'}) to run on rank {owner}")
    nodes = tuple(_one_rank(node, owner, world, device) if node.name in found else node for node in program.nodes)
    return dataclasses.replace(program, nodes=nodes)


def _one_rank(node: Node, owner: int, world: BroadcastComm, wire: torch.device) -> Node:
    run = node.run
    assert run is not None

    def owned(slots: Mapping[str, Any], ctx: NodeContext) -> Mapping[str, Any]:
        if world.rank != owner:
            return receive(world, owner, wire)
        try:
            written = dict(run(slots, ctx))
        except Exception as exc:
            world.broadcast_object(_Failed(RankFailure.of(owner, exc)), owner)
            raise
        send(world, written, wire)
        return written

    return dataclasses.replace(node, run=owned)


@dataclass(frozen=True)
class _TensorSlot:
    """Where a broadcast tensor goes in the nest, and what the receivers allocate for it."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class _Record:
    """A dataclass instance in the nest: its class and its fields' (packed) values."""

    cls: type
    fields: dict[str, Any]


@dataclass(frozen=True)
class _Failed:
    """The owner's prompt node raised; the receivers raise the same error."""

    failure: RankFailure


def send(world: BroadcastComm, written: Mapping[str, Any], wire: torch.device) -> None:
    """The owner's side: the nest, then each tensor on `wire`'s device."""
    tensors: list[Tensor] = []
    world.broadcast_object(pack(dict(written), tensors, wire), world.rank)
    for tensor in tensors:
        world.broadcast(_as_bytes(tensor), world.rank)


def receive(world: BroadcastComm, owner: int, wire: torch.device) -> dict[str, Any]:
    """A receiver's side: the slots the owner's node wrote (or its error, raised here)."""
    nest = world.broadcast_object(None, owner)
    if isinstance(nest, _Failed):
        raise nest.failure.to_exception()
    tensors = []
    for slot in _tensor_slots(nest):
        tensor = torch.empty(slot.shape, dtype=slot.dtype, device=wire)
        world.broadcast(_as_bytes(tensor), owner)  # fills `tensor` through its byte view
        tensors.append(tensor)
    return unpack(nest, tensors)


def _as_bytes(tensor: Tensor) -> Tensor:
    """A contiguous tensor's storage seen as flat uint8 (a view): every dtype travels bit for bit, including those a
    backend does not reduce or broadcast itself (gloo and bool, complex; NCCL and float8)."""
    return tensor.reshape(-1).view(torch.uint8)


def pack(value: Any, tensors: list[Tensor], wire: torch.device) -> Any:
    """`value` with each tensor on `wire`'s device type replaced by a _TensorSlot (appended to `tensors`)."""
    if isinstance(value, Tensor):
        if value.device.type != wire.type:
            return value
        tensors.append(value.detach().contiguous())
        return _TensorSlot(len(tensors) - 1, tuple(value.shape), value.dtype)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _Record(type(value), {f.name: pack(getattr(value, f.name), tensors, wire)
                                     for f in dataclasses.fields(value)})
    if isinstance(value, tuple):
        items = [pack(item, tensors, wire) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, list):
        return [pack(item, tensors, wire) for item in value]
    if isinstance(value, dict):
        return {key: pack(item, tensors, wire) for key, item in value.items()}
    return value


def unpack(nest: Any, tensors: list[Tensor]) -> Any:
    """The value `pack` gave `nest` for, with `tensors` (by index) in the slots."""
    if isinstance(nest, _TensorSlot):
        return tensors[nest.index]
    if isinstance(nest, _Record):
        obj = nest.cls.__new__(nest.cls)  # fields set as they were, without running __init__ / __post_init__ again
        for name, item in nest.fields.items():
            object.__setattr__(obj, name, unpack(item, tensors))
        return obj
    if isinstance(nest, tuple):
        items = [unpack(item, tensors) for item in nest]
        return type(nest)(*items) if hasattr(nest, "_fields") else type(nest)(items)
    if isinstance(nest, list):
        return [unpack(item, tensors) for item in nest]
    if isinstance(nest, dict):
        return {key: unpack(item, tensors) for key, item in nest.items()}
    return nest


def _tensor_slots(nest: Any) -> list[_TensorSlot]:
    """Every _TensorSlot in `nest`, by index."""
    found: list[_TensorSlot] = []
    pending = [nest]
    while pending:
        item = pending.pop()
        if isinstance(item, _TensorSlot):
            found.append(item)
        elif isinstance(item, _Record):
            pending.extend(item.fields.values())
        elif isinstance(item, (tuple, list)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
    return sorted(found, key=lambda slot: slot.index)
