"""A worker process: join the process group, load the model once, then run commands in lockstep.

Rank 0 takes commands from the parent's queue and broadcasts them; the other ranks follow
the broadcasts. Every rank runs the whole program (text encoding, denoising, decoding): the
text encoder and the VAE are deterministic given the same weights and inputs, so each rank
computes the same embeddings and nothing needs to be broadcast, and no rank ever waits
alone while another works. The exception is parallel.text_encoder_rank (--text-encoder-rank):
then only that rank loads the text encoder and runs the prompt nodes, and broadcasts what they
write (runtime.parallel.prompt_rank), trading one short wait per request for the encoder's
weights on every other device. Only rank 0's outputs go back to the parent.
"""

from __future__ import annotations

import os
import queue
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from vidloom import registry
from vidloom.core import plugin
from vidloom.core.adapters import NO_ADAPTERS, StepAdapters
from vidloom.core.deploy import DeployConfig
from vidloom.core.instance import ModelInstance
from vidloom.core.parallel import TokenLayout
from vidloom.diffusion.guidance import ParallelCFG
from vidloom.loading.host_blocks import HostBlocks, blocks_on_host
from vidloom.runtime.rank_share import RankShare
from vidloom.runtime.engine import Engine
from vidloom.runtime.parallel.comm import RankGroups, build_groups, init_distributed, shutdown_distributed
from vidloom.runtime.parallel.messages import Fatal, Heartbeat, Ready, Shutdown
from vidloom.runtime.parallel.rank import RankRuntime
from vidloom.runtime.parallel.prompt_rank import encode_on_one_rank
from vidloom.runtime.parallel.shard_weights import ShardedBlock, held_weight_bytes, shard_blocks
from vidloom.runtime.parallel.ulysses import apply_sp

DEBUG_ENV = "VIDLOOM_PARALLEL_DEBUG"


@dataclass(frozen=True)
class PoolOptions:
    """How the pool supervises its workers; defaults suit real models on GPUs."""

    collective_timeout_s: float = 600.0
    """Any collective (tensor exchange, command, status) that waits longer fails the request and
    breaks the pool. Must exceed the longest gap between two collectives (the VAE decode, a
    first torch.compile), like NCCL's own default of 10 minutes."""
    startup_timeout_s: float = 1800.0
    """How long every rank may take to join and load the weights before the start counts as failed."""
    check_lockstep: bool = False
    """Debug: after every unit, ranks all-gather a record of what they ran (step index, timestep,
    fingerprints of every step input) and the request fails if any rank differs from rank 0."""
    poll_s: float = 0.25
    """How often the parent checks that every worker is alive while it waits for a reply."""

    @property
    def heartbeat_s(self) -> float:
        """Idle rank 0 broadcasts a heartbeat this often, well inside the collective timeout."""
        return self.collective_timeout_s / 4

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> PoolOptions:
        """Defaults, with check_lockstep switched on by VIDLOOM_PARALLEL_DEBUG=1."""
        return cls(check_lockstep=environ.get(DEBUG_ENV, "") == "1")


@dataclass(frozen=True)
class LoraSetup:
    """The adapters of a pool's ranks: the registry bound, those fused into the weights at load, and those resident
    (loaded at run time: a restart loads them again, in order)."""

    max_loras: int | None = None
    """Resident adapters at most (None: the registry's default)."""
    fused: tuple[tuple[str, str, float], ...] = ()
    """(name, file, scale) added into the base weights at load (fuse_loras)."""
    resident: tuple[tuple[str, str, str | None], ...] = ()
    """(name, file, component or None) loaded at run time, in load order."""

    def apply(self, instance: ModelInstance, adapters: StepAdapters) -> None:
        """Give `instance` these adapters (before the plan wraps its attention)."""
        if self.fused:
            adapters.fuse(instance, {name: (path, scale) for name, path, scale in self.fused})
        elif self.max_loras is not None or self.resident:
            registry = adapters.registry(instance, self.max_loras)
            for name, path, into in self.resident:
                registry.load(name, path, into)


@dataclass(frozen=True)
class WorkerSpec:
    """What every rank of a pool loads (the same for all ranks)."""

    model: str
    """Registered model id or checkpoint directory; each process rebuilds the card from it."""
    checkpoint: str
    """The resolved checkpoint directory."""
    device_type: str
    """"cuda" (rank r uses the r-th local GPU) or "cpu"."""
    dtype: torch.dtype | None
    """Compute dtype override, as given to from_pretrained."""
    deploy: DeployConfig
    """Deployment, including devices and the parallel plan."""
    options: PoolOptions = field(default_factory=PoolOptions)
    """Timeouts and debug checks."""
    loras: LoraSetup = field(default_factory=LoraSetup)
    """The LoRA adapters every rank holds from its start (a restarted pool loads the resident ones again)."""
    adapters: StepAdapters = NO_ADAPTERS
    """How the ranks' engines apply and load adapters (the builder injects vidloom.lora's, as for one device)."""


@dataclass(frozen=True)
class RankPlace:
    """Where one process sits in the pool."""

    rank: int
    """Global rank (0 decides and talks to the parent)."""
    world_size: int
    """Processes in the pool."""
    local_rank: int
    """Index among the processes on this machine (picks the GPU)."""
    local_world_size: int
    """Processes on this machine (they share its CPU cores)."""
    init_method: str
    """torch.distributed rendezvous: file://... for spawned pools, env:// under torchrun."""


def start_rank(spec: WorkerSpec, place: RankPlace) -> RankRuntime:
    """Join the group, load the model on this rank's device, apply the parallel plan, build the engine."""
    if spec.device_type == "cuda":
        device = torch.device("cuda", place.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # Ranks on one machine share its cores; more threads than cores makes every rank slower.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // place.local_world_size))
    options = spec.options
    control = init_distributed(
        place.init_method, place.rank, place.world_size, device, options.startup_timeout_s,
        options.collective_timeout_s,
    )
    groups = build_groups(spec.deploy.parallel, place.rank, options.collective_timeout_s)
    card = registry.resolve_card(spec.model)
    owner = spec.deploy.parallel.text_encoder_rank
    # --shard-weights: the denoisers' blocks stay on the host until rank_engine has moved this rank's slices of them
    # to the device, so the device never holds a denoiser whole (loading.host_blocks).
    with blocks_on_host() if spec.deploy.parallel.shard_weights else nullcontext() as held:
        instance = registry.load_instance(card, Path(spec.checkpoint), device, spec.dtype, spec.deploy,
                                          text_encoder_here=owner in (None, place.rank))
    spec.loras.apply(instance, spec.adapters)
    sharded: list[ShardedBlock] = []
    engine = rank_engine(instance, registry.token_layout(card, Path(spec.checkpoint)), groups, spec.adapters, sharded,
                         held)
    return RankRuntime(engine, control, options.check_lockstep,
                       weight_bytes=lambda: held_weight_bytes(instance.components, sharded))


def rank_engine(instance: ModelInstance, layout: TokenLayout, groups: RankGroups,
                adapters: StepAdapters = NO_ADAPTERS, sharded: list[ShardedBlock] | None = None,
                held: HostBlocks | None = None) -> Engine:
    """This rank's engine over its own copy of the model: every denoiser the layout names sharded over
    groups.sp, the CFG branches split over groups.cfg, the prompt nodes run on parallel.text_encoder_rank alone
    (whose encoded prompts the others receive). `sharded` collects the handles of the sharded blocks; `held`: the
    blocks the load kept on the host (--shard-weights), which go to the device as slices or, when not sharded, whole."""
    handles: list[ShardedBlock] = []
    if groups.sp is not None:
        for name in layout.denoisers:
            if name in instance.components:
                apply_sp(instance[name], groups.sp)
                if instance.deploy.parallel.shard_weights:
                    handles += shard_blocks(instance[name].compile_units(), groups.sp, instance.device)
    if sharded is not None:
        sharded.extend(handles)
    if held is not None:  # before the program is built: nothing may run a block still on the host
        held.release(instance.device, keep={id(handle.block) for handle in handles})
    # A layout that allows --cfg-parallel promises a program builder taking `guidance=` (launch checked it).
    extra = {"guidance": ParallelCFG(groups.cfg)} if groups.cfg is not None else {}
    # A step cache's skip decisions: measured over the whole sequence by every rank of the sp group alike; under
    # --cfg-parallel each rank decides its own branch (as one device does per branch), and says whose counts it has.
    note = None if groups.cfg is None else ("the conditional branch's (cfg-rank 0); the unconditional branch's run on "
                                            "cfg-rank 1" if groups.cfg.rank == 0 else "the unconditional branch's")
    share = RankShare(sums=groups.sp, note=note, tiles=groups.world)
    program = plugin.resolve(instance.card.program)(instance, **extra)
    owner = instance.deploy.parallel.text_encoder_rank
    if owner is not None and groups.world is not None:
        program = encode_on_one_rank(program, layout.prompt_nodes, owner, groups.world, instance.device)
    return Engine(instance, program, adapters=adapters, rank_share=share)


def worker_main(
    spec: WorkerSpec, place: RankPlace, commands: Any, replies: Any, parent_pid: int,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Entry point of a started worker; `commands` (rank 0 only) and `replies` are multiprocessing queues.

    `environ`: the parent's environment at pool start (a forkserver's children inherit the server's, from its start).
    """
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    try:
        runtime = start_rank(spec, place)
    except BaseException as exc:  # report why, or the parent only sees an exit code
        replies.put(Fatal(place.rank, f"startup failed: {type(exc).__name__}: {exc}"))
        shutdown_distributed()
        sys.exit(1)
    replies.put(Ready(place.rank))
    healthy = False
    try:
        if place.rank == 0:
            healthy = serve_queue(runtime, commands, replies, parent_pid, spec.options.heartbeat_s)
        else:
            healthy = runtime.follow()
    except BaseException as exc:  # a lost peer or a timed-out command: this rank cannot go on
        replies.put(Fatal(place.rank, f"{type(exc).__name__}: {exc}"))
    finally:
        runtime.close_all()
        shutdown_distributed()
    sys.exit(0 if healthy else 1)


def serve_queue(runtime: RankRuntime, commands: Any, replies: Any, parent_pid: int, heartbeat_s: float) -> bool:
    """Rank 0: broadcast each command from the parent, run it, send the reply. True after Shutdown."""
    launcher = os.getppid()  # the parent, or the forkserver (which exits with the parent)
    idle_since = time.monotonic()
    while True:
        try:
            command = commands.get(timeout=min(1.0, heartbeat_s))
        except queue.Empty:
            if os.getppid() != launcher or not _exists(parent_pid):
                command = Shutdown()  # the parent died without closing us: take the others down too
            elif time.monotonic() - idle_since >= heartbeat_s:
                command = Heartbeat()
            else:
                continue
        runtime.control.broadcast(command)
        idle_since = time.monotonic()
        if isinstance(command, Shutdown):
            return True
        reply = runtime.execute(command)
        if reply is not None:
            replies.put(reply)
            if reply.fatal:
                return False


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's (the pid was reused)
        pass
    return True
