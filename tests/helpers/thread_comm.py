"""An in-process stand-in for a process group: P threads exchange tensors through shared slots.

Lets unit tests run P "ranks" of sequence- or CFG-parallel code in one process, with no
torch.distributed, and compare against one device exactly.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


class _Exchange:
    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: list[Any] = [None] * size
        self.barrier = threading.Barrier(size, timeout=30)


class ThreadComm:
    """Rank `rank` of a group whose ranks are threads of this process (a Comm)."""

    def __init__(self, exchange: _Exchange, rank: int) -> None:
        self._exchange = exchange
        self.rank = rank
        self.size = exchange.size

    def all_to_all(self, x: Tensor) -> Tensor:
        assert x.shape[0] == self.size
        chunks = self._share(x)
        return torch.stack([chunks[src][self.rank] for src in range(self.size)])

    def all_gather(self, x: Tensor) -> Tensor:
        return torch.stack(self._share(x))

    def shift(self, x: Tensor) -> Tensor:
        return self._share(x)[(self.rank - 1) % self.size]

    def broadcast(self, x: Tensor, src: int) -> Tensor:
        x.copy_(self._share(x)[src])
        return x

    def broadcast_object(self, obj: object, src: int) -> object:
        return self._share(obj)[src]

    def _share(self, x: Any) -> list[Any]:
        ex = self._exchange
        ex.slots[self.rank] = x.clone() if isinstance(x, Tensor) else x
        ex.barrier.wait()  # everyone has written
        shared = list(ex.slots)
        ex.barrier.wait()  # everyone has read before anyone writes the next exchange
        return shared  # type: ignore[return-value]


def thread_group(size: int) -> list[ThreadComm]:
    exchange = _Exchange(size)
    return [ThreadComm(exchange, rank) for rank in range(size)]


def run_ranks(comms: list[ThreadComm], fn: Callable[[ThreadComm], T]) -> list[T]:
    """fn(comm) on one thread per rank; results in rank order (exceptions propagate)."""
    with ThreadPoolExecutor(len(comms)) as pool:
        return list(pool.map(fn, comms))
