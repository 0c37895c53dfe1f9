"""torch.distributed for the worker pool: process-group setup, tensor groups and the command channel.

Two kinds of traffic, two kinds of groups, both with the pool's collective timeout. Tensors
(all-to-all, all-gather inside a step) go over the sp and cfg groups: NCCL on CUDA, gloo on
CPU. Commands and per-step status are small Python objects and go over a gloo group, as they
must work whatever the tensor backend is. The default group only carries the rendezvous and
group creation, with the (longer) startup timeout, since ranks start and load at their own pace.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from vidloom.core.parallel import ParallelPlan

# torch 2.13 renamed all_gather_into_tensor (deprecated there); older releases only have the old name.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Comm(Protocol):
    """The ranks of one parallel dimension (a sequence-parallel group, a CFG pair)."""

    rank: int
    """This process's index in the group."""
    size: int
    """Ranks in the group."""

    def all_to_all(self, x: Tensor) -> Tensor:
        """x [size, ...]: chunk j goes to rank j. Returns [size, ...] where chunk i came from rank i."""
        ...

    def all_gather(self, x: Tensor) -> Tensor:
        """[size, *x.shape]: every rank's x, in rank order, identical on every rank."""
        ...

    def shift(self, x: Tensor) -> Tensor:
        """One step around the ring: x goes to rank + 1; returns rank - 1's x (same shape on every rank)."""
        ...


class BroadcastComm(Comm, Protocol):
    """A group that also sends one rank's values to all (runtime.parallel.prompt_rank: the encoded prompt)."""

    def broadcast(self, x: Tensor, src: int) -> Tensor:
        """Rank `src`'s x, written into x on every other rank (which pass a tensor of its shape and dtype)."""
        ...

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """Rank `src`'s picklable `obj` on every rank."""
        ...


class GroupComm:
    """A torch.distributed process group seen as a Comm."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int) -> None:
        self.group = group
        self.rank = rank
        self.size = size

    # Collectives stay outside torch.compile graphs (compiled DiT blocks break around them).
    @torch.compiler.disable
    def all_to_all(self, x: Tensor) -> Tensor:
        if x.shape[0] != self.size:
            raise ValueError(f"all_to_all needs a leading dim of {self.size} chunks, got {tuple(x.shape)}")
        send = x.contiguous()
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=self.group)
        return received

    @torch.compiler.disable
    def all_gather(self, x: Tensor) -> Tensor:
        send = x.contiguous().reshape(1, *x.shape)
        # The single-tensor gather concatenates along dim 0 on every backend; dim 0 here is the rank.
        received = send.new_empty((self.size, *x.shape))
        _all_gather_single(received, send, group=self.group)
        return received

    @torch.compiler.disable
    def broadcast(self, x: Tensor, src: int) -> Tensor:
        """Rank `src`'s x, written into x on every other rank (which pass a tensor of its shape and dtype)."""
        dist.broadcast(x, src=dist.get_global_rank(self.group, src), group=self.group)
        return x

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """Rank `src`'s picklable `obj` on every rank (the others pass anything)."""
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, src), group=self.group)
        return box[0]

    @torch.compiler.disable
    def shift(self, x: Tensor) -> Tensor:
        if self.size == 1:
            return x.clone()
        send = x.contiguous()
        received = torch.empty_like(send)
        peers = [dist.get_global_rank(self.group, (self.rank + step) % self.size) for step in (1, -1)]
        ops = [dist.P2POp(dist.isend, send, peers[0], self.group), dist.P2POp(dist.irecv, received, peers[1], self.group)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        return received


@dataclass(frozen=True)
class RankGroups:
    """This rank's groups for each parallel dimension (None where the degree is 1)."""

    sp: Comm | None
    """Sequence-parallel group: adjacent ranks sharing one CFG branch."""
    cfg: Comm | None
    """CFG pair: the ranks holding the same token shard of the cond and the uncond branch."""
    world: BroadcastComm | None = None
    """Every rank of the plan: a tiled VAE decode splits its tiles over them (layers.tiling.shared_tiles)."""


def build_groups(plan: ParallelPlan, rank: int, timeout_s: float) -> RankGroups:
    """Create every group of `plan` (collectively: all ranks call this in the same order)."""
    sp_ranks = [[c * plan.sp + s for s in range(plan.sp)] for c in range(plan.cfg)]
    cfg_ranks = [[c * plan.sp + s for c in range(plan.cfg)] for s in range(plan.sp)]
    timeout = datetime.timedelta(seconds=timeout_s)
    return RankGroups(
        sp=_my_group(sp_ranks, rank, timeout) if plan.sp > 1 else None,
        cfg=_my_group(cfg_ranks, rank, timeout) if plan.cfg > 1 else None,
        world=GroupComm(dist.group.WORLD, rank, plan.world_size) if plan.world_size > 1 else None,
    )


def _my_group(partition: list[list[int]], rank: int, timeout: datetime.timedelta) -> GroupComm:
    mine: GroupComm | None = None
    for ranks in partition:
        # new_group is itself collective over the whole world, even for ranks outside `ranks`.
        group = dist.new_group(ranks, timeout=timeout)
        if rank in ranks:
            mine = GroupComm(group, ranks.index(rank), len(ranks))
    assert mine is not None, f"rank {rank} is in no group of {partition}"
    return mine


class ControlChannel:
    """Rank 0's commands to every rank, and every rank's status back, as picklable objects (gloo)."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int) -> None:
        self.group = group
        self.rank = rank
        self.size = size

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0 passes the object; every rank returns it."""
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's object, in rank order."""
        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered


def init_distributed(
    init_method: str, rank: int, world_size: int, device: torch.device, startup_timeout_s: float,
    collective_timeout_s: float,
) -> ControlChannel:
    """Join the pool's process group (NCCL on CUDA, gloo on CPU) and open the command channel.

    Every later collective fails after `collective_timeout_s` instead of hanging, so a stuck
    peer ends the request with an error; rank 0 keeps idle peers inside it with heartbeats.
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    options: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=startup_timeout_s), **options,
    )
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=collective_timeout_s))
    return ControlChannel(control, rank, world_size)


def shutdown_distributed() -> None:
    """Leave the process group (idempotent); after a failed collective this may itself fail, harmlessly."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a broken group cannot always be torn down cleanly; the process exits next
            pass
