"""Shape buckets of a torch.compile'd denoiser: which request shapes run compiled code.

The DiT blocks compile with `dynamic=False`, so every new token count or batch size is a
recompile (seconds to minutes), and past dynamo's recompile limit torch silently runs the
blocks eagerly for every shape. So the compiled shapes are bounded: the declared
`warmup_shapes` (compiled at load), or without any, the first `LAZY_SHAPES` shapes seen.
A request outside them is logged, counted (`misses`, exported as a Prometheus counter) and
runs eagerly under `torch.compiler.set_stance("eager_on_recompile")`, so it neither stalls
on a compile nor evicts a bucket.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from vidloom.core.denoiser import CompileUnits
from vidloom.core.errors import DeployError
from vidloom.core.request import GenerationRequest

log = logging.getLogger(__name__)

LAZY_SHAPES = 4
"""Shapes compiled on first use when no warmup_shapes are declared."""


@dataclass(frozen=True)
class ShapeKey:
    """What the compiled blocks specialise on: the token grid (from the video size) and the batch."""

    height: int
    width: int
    num_frames: int
    batch: int
    """Rows per DiT forward: 2 for batched CFG with guidance on, else 1."""

    def __str__(self) -> str:
        return f"{self.height}x{self.width}x{self.num_frames} batch {self.batch}"


def shape_key(request: GenerationRequest, cfg_batched: bool) -> ShapeKey:
    batch = 2 if cfg_batched and request.uses_cfg else 1
    return ShapeKey(request.height, request.width, request.num_frames, batch)


class CompileBuckets:
    """Decides per request whether it runs the compiled blocks; thread-safe."""

    def __init__(self, declared: tuple[tuple[int, int, int], ...], cfg_batched: bool) -> None:
        self.cfg_batched = cfg_batched
        batches = (1, 2) if cfg_batched else (1,)
        self._compiled = {ShapeKey(h, w, f, b) for h, w, f in declared for b in batches}
        self._closed = bool(declared)
        self._lock = threading.Lock()
        self.misses = 0

    @property
    def compiled_shapes(self) -> int:
        """Shapes compiled (or declared for compiling at load) so far: the recompiles this engine caused."""
        with self._lock:
            return len(self._compiled)

    @property
    def capacity(self) -> int:
        """Most shapes that will ever be compiled (what dynamo's recompile limit must allow)."""
        return len(self._compiled) if self._closed else LAZY_SHAPES

    def admit(self, request: GenerationRequest) -> bool:
        """True: run compiled (maybe compiling this shape now); False: outside the buckets, run eagerly."""
        key = shape_key(request, self.cfg_batched)
        with self._lock:
            if key in self._compiled:
                return True
            if not self._closed and len(self._compiled) < LAZY_SHAPES:
                self._compiled.add(key)
                log.info("compiling the DiT blocks for a new shape, %s (%d of %d without warmup_shapes)",
                         key, len(self._compiled), LAZY_SHAPES)
                return True
            self.misses += 1
        log.warning("request %s (%s) is outside the compiled shape buckets; it runs eagerly "
                    "(declare the shape with --warmup HxWxF to compile it at load)", request.request_id, key)
        return False


def compile_denoisers(components: Mapping[str, Any], backend: str, model_id: str) -> int:
    """`torch.compile` every resident component's units (core.denoiser.CompileUnits), each on its own:
    dynamic=False (one graph per shape bucket; identical blocks share it), or a symbolic token axis where the
    component declares `compile_dynamic` (an AR decoder: every step packs a different number of tokens).
    Written once for every family: a card that declares `compile` must hold such a component. Returns the
    number of units wrapped."""
    units = [(unit, bool(getattr(component, "compile_dynamic", False)))
             for component in components.values() if isinstance(component, CompileUnits)
             for unit in component.compile_units()]
    if not units:
        raise DeployError(f"compile (--compile): {model_id} loaded no component that declares compile units")
    for unit, dynamic in units:
        unit.compile(backend=backend, dynamic=dynamic)
    return len(units)
