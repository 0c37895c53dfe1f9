"""GraphMemory: the device memory captured graphs keep, charged to the request memory ledger (runtime.admission).

Nothing may be admitted that does not fit, and a captured step keeps memory for as long as its graph is kept:

- its static inputs, the buffers a replay copies fresh values into (runtime.cudagraph): exactly their bytes, one
  ledger entry per step body, resized as its graphs come and go;
- its private memory pool, where the captured step's activations and outputs stay reserved for the replays. The graphs
  of one engine share one pool (CudaGraphCapturer), which grows when a capture needs more than it has free and gives
  nothing back while any of its graphs lives (a later capture reuses what an earlier one freed). Its entry grows by
  each capture's growth (CUDA: the pool's segments, read once after the capture; a capturer that reports no pool, as
  the CPU stand-in of the tests: the capture's output buffers) and is released when the last graph goes, the
  capturer then starting a fresh pool so that the allocator can free the old one.

A capture that would not fit is not kept: the static inputs are checked before capturing (their bytes are known), the
pool's growth after (it is known only then); either way that step signature runs eagerly until the ledger has the
room it lacked (runtime.cudagraph logs it, and the run that met it reports cuda_graphs turned off, runtime.turned_off).
Growth that a pool still holding other graphs keeps after its new graph was discarded stays charged, even over the
budget (the memory is held whether or not the graph is kept), until the pool retires.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable

import torch

from vidloom.core.footprint import tensor_bytes
from vidloom.core.limits import format_bytes
from vidloom.runtime.admission import BUDGET_NAME, MemoryAdmission

GRAPHS_KIND = "cuda graphs"
"""What the ledger calls the entries of captured graphs (MemoryAdmission.held_by)."""
POOL_ENTRY = ("cuda-graphs", "pool")


def pool_reserved(device: Any, pool: tuple[int, int]) -> int:
    """Bytes the caching allocator's segments of private pool `pool` reserve on CUDA `device`: a host-side read of
    the allocator's books (no device sync), once after each capture."""
    try:
        segments = torch.cuda.memory_snapshot(pool, include_traces=False)
    except TypeError:  # an older torch: every segment, filtered below
        segments = torch.cuda.memory_snapshot()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return sum(int(s["total_size"]) for s in segments
               if s.get("device", index) == index and tuple(s.get("segment_pool_id", pool)) == tuple(pool))


def pool_growth(capture: Any) -> int:
    """Bytes a capture added to its pool: what the capturer measured (`pool_bytes`), else its output buffers."""
    measured = getattr(capture, "pool_bytes", None)
    return int(measured) if measured is not None else tensor_bytes(capture.output)


class GraphMemory:
    """The ledger entries of one engine's captured graphs (one pool); `ledger` None (not attached): nothing checked."""

    def __init__(self, new_pool: Callable[[], None] | None = None) -> None:
        """`new_pool`: start the capturer's next pool (the old one is freed with its last graph)."""
        self.ledger: MemoryAdmission | None = None
        self._new_pool = new_pool
        self._lock = threading.Lock()
        self._graphs = 0  # graphs alive in the pool
        self.pool_bytes = 0  # what the pool's captures added, charged under POOL_ENTRY

    def attach(self, ledger: MemoryAdmission | None) -> None:
        """Charge to `ledger` from now on (the engine's, once its budget is measured: before any capture)."""
        self.ledger = ledger

    def free(self) -> int | None:
        """Bytes the budget has left (None: not checked)."""
        return None if self.ledger is None else self.ledger.free_bytes()

    def inputs(self, step: Hashable, nbytes: int) -> bool:
        """Charge step body `step`'s static inputs at their current total `nbytes`; False: growing to it does not fit
        (nothing changed). Shrinking always succeeds."""
        return self.ledger is None or self.ledger.resize(("cuda-graphs", "inputs", step), nbytes, GRAPHS_KIND)

    def keep(self, growth: int) -> bool:
        """A new graph in the pool, which grew `growth` bytes capturing it; False: that does not fit, and the caller
        discards the graph (the growth stays charged while other graphs keep the pool; see the module docstring)."""
        with self._lock:
            if self.ledger is None or self.ledger.resize(POOL_ENTRY, self.pool_bytes + growth, GRAPHS_KIND):
                self._graphs += 1
                self.pool_bytes += growth
                return True
            if self._graphs == 0:
                self._retire()  # the discarded graph was its pool's only one: the pool goes with it
            else:
                self.pool_bytes += growth
                self.ledger.resize(POOL_ENTRY, self.pool_bytes, GRAPHS_KIND, force=True)
            return False

    def dropped(self, graphs: int) -> None:
        """`graphs` graphs were forgotten; the last one gone retires the pool and its charge."""
        if graphs <= 0:
            return
        with self._lock:
            self._graphs = max(0, self._graphs - graphs)
            if self._graphs == 0:
                self._retire()

    def refusal(self, needed: int, what: str) -> str:
        """Why a step runs eagerly: its graph's `needed` more bytes (`what`) do not fit."""
        return (f"a step's CUDA graph would keep {format_bytes(needed)} more ({what}) than the {BUDGET_NAME} has free "
                f"({format_bytes(self.free())}), so that step runs eagerly")

    def _retire(self) -> None:
        self.pool_bytes = 0
        if self.ledger is not None:
            self.ledger.resize(POOL_ENTRY, 0, GRAPHS_KIND)
        if self._new_pool is not None:
            self._new_pool()
