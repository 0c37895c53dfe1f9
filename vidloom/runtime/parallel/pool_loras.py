"""A pool's LoRA adapters, seen from the parent: every rank holds its own registry (each process its own copy of the
model), and this mirror loads and unloads on all of them at once through the command channel, between two request
units, so every rank's requests see the same adapters. It offers what callers use of one device's LoRARegistry
(names, adapters, fused, max_loras, load, unload), so VideoGenerator and the server's routes treat both alike."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from vidloom.core.adapters import DEFAULT_MAX_LORAS, StepAdapters, check_fused, check_loaded
from vidloom.core.card import ModelCard
from vidloom.core.errors import WorkerFailed
from vidloom.runtime.parallel.messages import AdapterCommand
from vidloom.runtime.parallel.worker import LoraSetup


@dataclass(frozen=True)
class PoolAdapter:
    """One adapter resident on every rank: its name, file and how many linears it adapts."""

    name: str
    path: Path
    layer_count: int


@dataclass(frozen=True)
class PoolFused:
    """One adapter the ranks added into their weights at load."""

    name: str
    path: Path
    scale: float


class PoolLoRAs:
    """The adapters of a pool's ranks (`transport`: the pool's Transport, whose `keep_adapters` records what a
    restart loads again; `adapters`: the implementation the ranks' engines were given, for the card check)."""

    def __init__(self, card: ModelCard, transport: Any, setup: LoraSetup, adapters: StepAdapters) -> None:
        self._card = card
        self._adapters = adapters
        self._transport = transport
        self._setup = setup
        self._resident: list[PoolAdapter] = []  # load order, as rank 0 last reported it
        self._lock = threading.Lock()  # one load or unload at a time (each is one command on every rank)
        self.fused = tuple(PoolFused(name, Path(path), scale) for name, path, scale in setup.fused)

    @property
    def names(self) -> list[str]:
        return [a.name for a in self._resident]

    @property
    def adapters(self) -> list[PoolAdapter]:
        return list(self._resident)

    @property
    def max_loras(self) -> int:
        return self._setup.max_loras if self._setup.max_loras is not None else DEFAULT_MAX_LORAS

    def load(self, name: str, path: str | Path, into: str | None = None, max_rank: int | None = None) -> PoolAdapter:
        """Load `path` as `name` on every rank (InvalidRequest / CheckpointError as one device raises them)."""
        self._adapters.check_card(self._card)
        path = Path(path).expanduser().absolute()  # the ranks run elsewhere: the same file whatever their cwd
        self._command(AdapterCommand(name, str(path), into, max_rank))
        with self._lock:
            kept = [r for r in self._setup.resident if r[0] != name and r[0] in self.names] + [(name, str(path), into)]
            self._keep(kept)
        return next(a for a in self._resident if a.name == name)

    def unload(self, name: str) -> None:
        """Forget `name` on every rank (InvalidRequest("name") when it is not loaded)."""
        self._command(AdapterCommand(name))
        with self._lock:
            self._keep([r for r in self._setup.resident if r[0] in self.names])

    def check(self, loras: Sequence[tuple[str, float]]) -> None:
        """At submit: the request names adapters the ranks hold (or exactly the fused set)."""
        if not loras:
            return
        if self.fused:
            check_fused(loras, [(f.name, f.scale) for f in self.fused])
        else:
            check_loaded(loras, self.names)

    def _command(self, command: AdapterCommand) -> None:
        with self._lock:
            self._transport.ensure_running()  # a broken pool restarts first, with the adapters it kept
            reply = self._transport.call(command)
            if reply.failure is not None and reply.fatal:
                raise WorkerFailed(reply.failure.rank, f"{reply.failure.kind}: {reply.failure.message}")
            if reply.failure is not None:
                raise reply.failure.to_exception()
            self._resident = [PoolAdapter(n, Path(p), count) for n, p, count in (reply.outputs or {})["adapters"]]

    def _keep(self, resident: list[tuple[str, str, str | None]]) -> None:
        self._setup = dataclasses.replace(self._setup, resident=tuple(resident))
        self._transport.keep_adapters(self._setup)
