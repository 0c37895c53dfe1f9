"""Starting a parallel deployment: spawned by vidloom, or launched by torchrun (env:// rendezvous).

Spawned (the default): the calling process is the parent and holds no weights; it starts
one WorkerPool process per device. Under torchrun every process runs the same command:
rank 0 becomes the parent *and* rank 0 (`InProcessRank0`), the others follow its
commands (`follow_torchrun`) until it shuts down. torchrun owns restarts there.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import time
from pathlib import Path
from typing import Mapping

import torch

from vidloom import registry
from vidloom.core.adapters import NO_ADAPTERS, StepAdapters
from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, WorkerFailed
from vidloom.runtime.parallel.comm import shutdown_distributed
from vidloom.runtime.parallel.engine import ParallelEngine, PoolInstance, Transport
from vidloom.runtime.parallel.messages import Command, Heartbeat, Shutdown, StepReply
from vidloom.runtime.parallel.plan import check_model, check_step_cache, check_warmup, sp_attention
from vidloom.runtime.parallel.pool import WorkerPool
from vidloom.runtime.parallel.rank import RankRuntime
from vidloom.runtime.parallel.worker import LoraSetup, PoolOptions, RankPlace, WorkerSpec, start_rank

log = logging.getLogger(__name__)


def torchrun_place(environ: Mapping[str, str] = os.environ) -> RankPlace | None:
    """This process's place when a launcher (torchrun) set RANK / WORLD_SIZE / MASTER_ADDR; else None."""
    if not all(key in environ for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return None
    world = int(environ["WORLD_SIZE"])
    return RankPlace(
        rank=int(environ["RANK"]),
        world_size=world,
        local_rank=int(environ.get("LOCAL_RANK", environ["RANK"])),
        local_world_size=int(environ.get("LOCAL_WORLD_SIZE", world)),
        init_method="env://",
    )


def launch_engine(
    model: str, card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None,
    deploy: DeployConfig, options: PoolOptions | None = None, loras: LoraSetup | None = None,
    adapters: StepAdapters = NO_ADAPTERS,
) -> ParallelEngine:
    """Check the plan against the checkpoint (DeployError before any process starts), then start the ranks, each
    with `adapters` (how its engine applies LoRA, as one device's builder gives it) and `loras` (its registry
    bound and the adapters fused at load)."""
    loras = loras or LoraSetup()
    if loras.fused or loras.max_loras is not None:
        adapters.check_card(card)  # InvalidRequest("lora") before any process starts
    spec = dataclasses.replace(_spec(model, checkpoint, device, dtype, deploy, options), loras=loras,
                               adapters=adapters)
    registry.check_deploy(card, deploy)  # each rank's load checks again; this fails before any process starts
    layout = registry.token_layout(card, checkpoint)
    check_model(deploy.parallel, layout)
    check_warmup(deploy, layout)
    check_step_cache(deploy, layout)
    if deploy.parallel.sp > 1 and sp_attention(deploy.parallel, layout) == "ring":
        log.info("sp=%d does not divide the model's %d attention heads: self-attention runs as ring attention "
                 "(keys and values pass around the ranks) instead of Ulysses", deploy.parallel.sp, layout.num_heads)
    place = torchrun_place()
    transport: Transport
    if place is None:
        if device.type == "cuda" and torch.cuda.device_count() < deploy.devices:
            raise DeployError(f"devices={deploy.devices} but only {torch.cuda.device_count()} CUDA devices are visible")
        transport = WorkerPool(spec)
    else:
        _check_torchrun(place, deploy)
        transport = InProcessRank0(start_rank(spec, place), spec.options.heartbeat_s)
    return ParallelEngine(transport, PoolInstance(card, deploy, device, str(checkpoint)), layout, loras, adapters)


def follow_torchrun(
    model: str, checkpoint: Path, device: torch.device, dtype: torch.dtype | None,
    deploy: DeployConfig, options: PoolOptions | None = None,
) -> bool:
    """A torchrun rank other than 0: load, then run rank 0's commands until it shuts down. True if clean."""
    place = torchrun_place()
    if place is None or place.rank == 0:
        raise DeployError("follow_torchrun is for torchrun ranks other than 0")
    _check_torchrun(place, deploy)
    runtime = start_rank(_spec(model, checkpoint, device, dtype, deploy, options), place)
    try:
        return runtime.follow()
    finally:
        runtime.close_all()
        shutdown_distributed()


class InProcessRank0:
    """Rank 0 in the caller's process (torchrun): a Transport without queues.

    A daemon thread broadcasts heartbeats while no command runs, so idle followers stay
    inside the collective timeout (a server may wait hours for its next request).
    """

    def __init__(self, runtime: RankRuntime, heartbeat_s: float) -> None:
        self.runtime = runtime
        self.epoch = 1
        self.broken = False
        self._closed = False
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        threading.Thread(target=self._beat, name="vidloom-heartbeat", daemon=True).start()
        atexit.register(self.close)  # followers exit cleanly even if nobody calls close()

    def call(self, command: Command) -> StepReply:
        with self._lock:
            if self.broken or self._closed:
                raise WorkerFailed(None, "the ranks stopped after an earlier failure; torchrun must restart them")
            try:
                self.runtime.control.broadcast(command)
                reply = self.runtime.execute(command)
            except Exception as exc:  # a lost peer or a timed-out command
                self.broken = True
                raise WorkerFailed(0, f"{type(exc).__name__}: {exc}") from exc
            finally:
                self._last = time.monotonic()
            assert reply is not None
            self.broken = reply.fatal
            return reply

    def ensure_running(self) -> None:
        if self.broken:
            self.restart()

    def keep_adapters(self, setup: LoraSetup) -> None:
        """Nothing to keep: torchrun, not vidloom, restarts these ranks (and they start without run-time adapters)."""

    def restart(self) -> None:
        raise WorkerFailed(None, "under torchrun vidloom cannot restart ranks; torchrun does (--max-restarts)")

    def close(self) -> None:
        self._stop.set()
        atexit.unregister(self.close)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self.broken:
                try:
                    self.runtime.control.broadcast(Shutdown())
                except Exception:  # the followers are gone already; nothing left to tell
                    pass
            self.runtime.close_all()
            shutdown_distributed()

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self._heartbeat_s)):
            with self._lock:
                if self._closed or self.broken or time.monotonic() - self._last < self._heartbeat_s:
                    continue
                try:
                    self.runtime.control.broadcast(Heartbeat())
                except Exception:
                    self.broken = True
                self._last = time.monotonic()


def _spec(
    model: str, checkpoint: Path, device: torch.device, dtype: torch.dtype | None,
    deploy: DeployConfig, options: PoolOptions | None,
) -> WorkerSpec:
    # The card is not sent: every process rebuilds it from `model` (its mapping proxies do not pickle).
    if device.index is not None:
        raise DeployError(f"with devices={deploy.devices} pass device='{device.type}'; rank r uses {device.type}:r")
    return WorkerSpec(str(model), str(checkpoint), device.type, dtype, deploy, options or PoolOptions.from_env())


def _check_torchrun(place: RankPlace, deploy: DeployConfig) -> None:
    if place.world_size != deploy.devices:
        raise DeployError(
            f"torchrun started {place.world_size} processes but devices (--devices) is {deploy.devices}; "
            f"the plan {deploy.parallel.describe()} needs {deploy.parallel.world_size}"
        )
