"""WorkerPool: one spawned process per device, supervised from the parent.

The parent talks to rank 0 only: a command queue in, a reply queue out (every rank also
uses the reply queue to say Ready or Fatal). While it waits, the parent polls every
worker's liveness, so a dead worker fails the request within `poll_s`, whatever the
others are doing. A failure breaks the pool: every worker is stopped, and the next
request restarts it (`ensure_running`), or a caller restarts it explicitly (`restart`).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing as mp
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from typing import Any

from vidloom.core.errors import WorkerFailed
from vidloom.runtime.parallel.messages import Command, Fatal, Ready, Shutdown, StepReply
from vidloom.runtime.parallel.worker import LoraSetup, RankPlace, WorkerSpec, worker_main

log = logging.getLogger(__name__)

_SETTLE_S = 2.0  # after a failure, how long to let the others exit before blaming one
_STOP_S = 10.0  # how long a clean shutdown may take before workers are terminated
_TERMINATE_S = 3.0  # then how long SIGTERM may take before SIGKILL (a stopped process ignores it)
# Imported once by the forkserver, so a rank starts without importing torch, vidloom's runtime and transformers' model
# base (every family's text encoder) again: seconds per rank.
_PRELOAD = ["vidloom.runtime.parallel.worker", "transformers.modeling_utils"]


class WorkerPool:
    """Processes for ranks 0..devices-1 of one deployment; `call` is one round trip to rank 0."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.epoch = 0
        """Bumped by every successful start; runs started in an older epoch are gone."""
        self.broken = True
        self._closed = False
        self._lock = threading.Lock()
        self._procs: list[Any] = []
        self._commands: Any = None
        self._replies: Any = None
        self._store: str | None = None
        atexit.register(self.close)  # never leave workers behind, even if nobody calls close()
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- public -------------------------------------------------------------------------

    def call(self, command: Command) -> StepReply:
        """Send `command` to rank 0 and wait for its reply; WorkerFailed if any worker dies or gives up."""
        with self._lock:
            if self._closed or self.broken:
                raise WorkerFailed(None, "the worker pool is closed" if self._closed else "the worker pool is broken")
            self._commands.put(command)
            while True:
                message = self._receive(deadline=None)
                if isinstance(message, StepReply):
                    if message.fatal:
                        self._stop(graceful=False)
                    return message

    def keep_adapters(self, setup: LoraSetup) -> None:
        """The LoRA adapters the next start of the ranks loads (the resident ones, after a restart)."""
        self.spec = dataclasses.replace(self.spec, loras=setup)

    def ensure_running(self) -> None:
        """Restart a broken pool (the automatic restart before a request's first unit)."""
        with self._lock:
            if self.broken and not self._closed:
                self._restart()

    def restart(self) -> None:
        """Stop every worker (if any still runs) and start a fresh pool; the weights load again."""
        with self._lock:
            self._restart()

    def close(self) -> None:
        """Shut every worker down (cleanly if idle), join them, and free the rendezvous files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        # A step in flight holds the lock; don't wait for it, stop the processes under it.
        acquired = self._lock.acquire(timeout=_STOP_S)
        try:
            self._stop(graceful=acquired and not self.broken)
        finally:
            if acquired:
                self._lock.release()

    def _restart(self) -> None:
        if self._closed:
            raise WorkerFailed(None, "the worker pool is closed")
        self._stop(graceful=not self.broken)
        self._start()

    @property
    def pids(self) -> list[int]:
        """Process ids by rank (for tests and operators)."""
        return [p.pid for p in self._procs]

    # -- lifecycle ------------------------------------------------------------------------

    def _start(self) -> None:
        ctx = _context()
        world = self.spec.deploy.devices
        self._store = tempfile.mkdtemp(prefix="vidloom-pool-")
        self._commands, self._replies = ctx.Queue(), ctx.Queue()
        init_method = f"file://{os.path.join(self._store, 'rendezvous')}"
        self._procs = []
        for rank in range(world):
            place = RankPlace(rank, world, rank, world, init_method)
            commands = self._commands if rank == 0 else None
            proc = ctx.Process(
                target=worker_main, args=(self.spec, place, commands, self._replies, os.getpid(), dict(os.environ)),
                name=f"vidloom-rank{rank}",
            )
            proc.start()
            self._procs.append(proc)
        deadline = time.monotonic() + self.spec.options.startup_timeout_s
        ready: set[int] = set()
        self.broken = False  # _receive breaks it again on any failure
        while len(ready) < world:
            message = self._receive(deadline)
            if isinstance(message, Ready):
                ready.add(message.rank)
        self.epoch += 1
        log.info("worker pool of %d ranks ready (%s)", world, self.spec.deploy.parallel.describe())

    def _stop(self, graceful: bool) -> None:
        self.broken = True
        if graceful and self._commands is not None and any(p.is_alive() for p in self._procs):
            self._commands.put(Shutdown())
            _join_all(self._procs, _STOP_S)
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        _join_all(self._procs, _TERMINATE_S)
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
        for q in (self._commands, self._replies):
            if q is not None:
                q.cancel_join_thread()  # a dead reader must not block our exit on unflushed data
                q.close()
        self._commands = self._replies = None
        if self._store is not None:
            shutil.rmtree(self._store, ignore_errors=True)
            self._store = None

    # -- waiting with liveness ----------------------------------------------------------------

    def _receive(self, deadline: float | None) -> Any:
        """The next message from the workers; on any failure, stop the pool and raise WorkerFailed."""
        while True:
            try:
                message = self._replies.get(timeout=self.spec.options.poll_s)
            except queue.Empty:
                if any(p.exitcode is not None for p in self._procs):
                    raise self._fail([])
                if deadline is not None and time.monotonic() > deadline:
                    raise self._fail([], f"not every rank was ready within {self.spec.options.startup_timeout_s:.0f} s")
                continue
            if isinstance(message, Fatal):
                raise self._fail([message])
            return message

    def _fail(self, reports: list[Fatal], timeout: str | None = None) -> WorkerFailed:
        """Stop the pool and name the rank to blame.

        In order: a rank that died without a word (killed, crashed); a rank still alive but
        silent while another reported a failed collective (stalled); else the first report.
        """
        settle = time.monotonic() + _SETTLE_S
        while time.monotonic() < settle and any(p.is_alive() for p in self._procs):
            time.sleep(0.05)
        reports = reports + _drain(self._replies)
        reported = {r.rank for r in reports}
        exits = [(rank, p.pid, p.exitcode) for rank, p in enumerate(self._procs) if rank not in reported]
        self._stop(graceful=False)
        abrupt = [(rank, pid, code) for rank, pid, code in exits if code not in (None, 0)]
        silent = [rank for rank, _, code in exits if code is None]
        if abrupt:
            rank, pid, code = abrupt[0]
            return WorkerFailed(rank, f"worker process {pid} {_exit_text(code)}; the pool was stopped")
        if reports and silent:
            return WorkerFailed(
                silent[0], f"stopped responding (rank {reports[0].rank} reported: {reports[0].reason}); the pool was stopped"
            )
        if reports:
            return WorkerFailed(reports[0].rank, f"{reports[0].reason}; the pool was stopped")
        return WorkerFailed(None, f"{timeout or 'a worker exited'}; the pool was stopped")


def _context() -> Any:
    """Where ranks start: never a fork of this process (fork after torch has run, with its threads or CUDA, is
    unsafe), but a fork of the forkserver, a fresh interpreter that imported torch and the worker once and runs no
    ops (no OpenMP pool, no CUDA context to inherit); spawn (a fresh interpreter per rank) where there is none."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # used by the server's first start only
    return ctx


def _drain(replies: Any) -> list[Fatal]:
    found = []
    while True:
        try:
            message = replies.get_nowait()
        except (queue.Empty, OSError, ValueError):
            return found
        if isinstance(message, Fatal):
            found.append(message)


def _join_all(procs: list[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))


def _exit_text(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
