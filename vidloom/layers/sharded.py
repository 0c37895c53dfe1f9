"""A sharded block's whole weights for work that reads them outside the block's forward.

--shard-weights (runtime.parallel.shard_weights) keeps 1/sp of every block's weights per rank and gathers them in a
hook around the block's forward. A prompt's cross-attention K/V, prepared once per request from a block's k/v
projections (layers.prompt_kv), runs outside that forward: `resident(module)` gathers the whole weights of the block
`module` belongs to for the duration, then frees them. Every rank of the sp group prepares the same prompts in the
same order (they run one program), so the all-gathers pair up as the forwards' do. Outside a sharded run it does
nothing.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Protocol, TypeVar

from torch import nn

SHARD = "_vidloom_shard"
"""The attribute naming the shard on every module of a sharded block (set in its instance dict, not registered)."""
T = TypeVar("T")


class Gathers(Protocol):
    def gather(self) -> None: ...

    def free(self) -> None: ...


def mark_sharded(block: nn.Module, shard: Gathers) -> None:
    """Tag `block` and each of its submodules with the shard that gathers their weights."""
    for module in block.modules():
        module.__dict__[SHARD] = shard


@contextmanager
def resident(module: nn.Module) -> Iterator[None]:
    """Inside, `module`'s block holds its whole weights (gathered over the sp group where it is sharded)."""
    shard = module.__dict__.get(SHARD)
    if shard is None:
        yield
        return
    shard.gather()
    try:
        yield
    finally:
        shard.free()


def each_resident(modules: Iterable[nn.Module], project: Callable[[nn.Module], T]) -> list[T]:
    """`project(module)` for each module in order, each with its block's whole weights resident while it runs (one
    block gathered at a time: a sharded model never holds more than one block whole)."""
    out = []
    for module in modules:
        with resident(module):
            out.append(project(module))
    return out
