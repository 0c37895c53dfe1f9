"""A parallel rank's part in a request: the groups its step caches and tiled decodes share work with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankShare:
    """What a rank of a parallel plan shares with its peers in each request it runs (runtime.parallel.worker.rank_engine
    builds it; Engine hands it to every RequestRun)."""

    sums: Any = None
    """The sequence-parallel group (a Comm) whose token shards each change measure sums over, so every rank of it
    takes the same skip decisions; None: this rank holds every token."""
    note: str | None = None
    """Said in the cache report: which CFG branches this rank's counts cover (under --cfg-parallel)."""
    tiles: Any = None
    """Every rank of the plan (a Comm): a tiled VAE decode splits its tiles over them (layers.tiling.shared_tiles)."""
