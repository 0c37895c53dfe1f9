"""ReservingRun: what a run reserves and gives back (memory admission, paged KV blocks, cache buffers) and its KV wait.

A run holds two kinds of reservation. Its estimated peak memory sits on the engine's admission ledger while it is
resident (`admit`, or its first unit, until `close`). Each loop's working set (KV blocks of the paged pool, cache
buffers) is taken through `hold` and given back when that loop ends, however it ends. A loop whose KV reservation
finds the pool busy either fails (KVPoolBusy) or, on a driver that steps it among others, waits for the blocks.
"""

from __future__ import annotations

from typing import Any, Callable, Generator, Hashable, Mapping, TypeVar

from vidloom.core.chat import ChatRequest
from vidloom.core.errors import KVPoolBusy
from vidloom.core.request import GenerationRequest
from vidloom.runtime.admission import MemoryAdmission
from vidloom.runtime.cache_manager import CacheManager
from vidloom.runtime.paged_decode import PagedDecoder
from vidloom.runtime.run_handle import RunHandle
from vidloom.runtime.static_buffers import StaticBuffers

T = TypeVar("T")


class ReservingRun(RunHandle):
    """The reservations of one run; RequestRun derives from it and sets `request` (whose id names them)."""

    request: GenerationRequest | ChatRequest

    def __init__(self, admission: MemoryAdmission | None, memory_bytes: int, decoder: PagedDecoder | None,
                 caches: CacheManager | None) -> None:
        # The request's estimated peak, held in `admission` while it is resident (see admit).
        self._admission = admission
        self.memory_bytes = memory_bytes
        self._admitted = admission is None
        self.decoder = decoder
        self.caches = caches or CacheManager()
        self.static: StaticBuffers | None = None  # the engine's static buffers under cuda_graphs (see allocate)
        self._releases: list[Callable[[], None]] = []  # what running loops hold (see hold)
        # Set by a driver that steps this run among others every round (AsyncEngine.submit, a speech request): a
        # loop whose reserve_kv finds its pool busy (KVPoolBusy) then waits, its init retried at each later unit,
        # instead of failing; `waiting_for_kv` is True meanwhile. Stepped alone nothing would free the blocks: it
        # fails.
        self.kv_wait = False
        self.waiting_for_kv = False

    @property
    def kind(self) -> str:
        """What the admission ledger calls this run: "chat", or "request" (a generation, a speech request...)."""
        return "chat" if isinstance(self.request, ChatRequest) else "request"

    def admit(self) -> bool:
        """Hold this request's estimated memory among the engine's resident requests; False: no room now
        (a queue keeps it waiting). Released by `close`."""
        if not self._admitted and self._admission is not None:
            self._admitted = self._admission.try_reserve(self, self.memory_bytes, self.kind) or (
                self._room_from_static() and self._admission.try_reserve(self, self.memory_bytes, self.kind))
        return self._admitted

    def check_cancelled(self) -> None:
        """Raise Cancelled when the run was cancelled (the subclass's token)."""
        raise NotImplementedError

    def _admit_or_fail(self) -> None:
        """Stepped without a queue: no room is an error (CacheBudgetExceeded), raised before any work."""
        if not self.admit():
            assert self._admission is not None
            self._admission.reserve(self, self.memory_bytes, self.kind)  # raises with the numbers
            self._admitted = True

    def _leave_admission(self) -> None:
        if self._admission is not None:
            self._admission.release(self)
        if self.static is not None:  # static buffers this run gave back take their own entries now
            self.static.settle(self.caches, self._admission)

    def _room_from_static(self) -> bool:
        """Free idle static buffers (and their graphs) for a request the ledger has no room for; False: none."""
        return self.static is not None and self.static.make_room(self.caches)

    # -- what loops hold, given back when they end --------------------------------------

    def hold(self, release: Callable[[], None]) -> None:
        """Call `release` when the current loop ends (finish, failure or cancel)."""
        self._releases.append(release)

    def _release_held(self, keep: int) -> None:
        while len(self._releases) > keep:
            self._releases.pop()()

    def reserve_kv(self, tokens: int, network: Any = None) -> str:
        """Blocks of the engine's paged pool for `network` (None: the chat loop's) for one sequence, returned to
        it when the loop ends."""
        if self.decoder is None:
            raise RuntimeError("this engine has no paged KV pool (its program declares no chat_loop)")
        seq_id = self.decoder.reserve(self.request.request_id, tokens, network)
        decoder = self.decoder
        self.hold(lambda: decoder.release(seq_id))
        return seq_id

    @property
    def captures_steps(self) -> bool:
        """Under cuda_graphs (the engine's static buffers set): this run's steps may replay graphs."""
        return self.static is not None

    def allocate(self, nbytes: int, build: Callable[[], T], reuse: Hashable | None = None) -> T:
        """A cache buffer accounted to this request, released with the loop that asked for it. `reuse`: under
        cuda_graphs (`static` set), the buffer is a static one of that key (runtime.static_buffers), given back to
        the pool instead of freed, so the graphs recorded over it replay for the next request of its shape."""
        static, caches, owner = self.static, self.caches, self.request.request_id
        if reuse is None or static is None:
            handle, buffer = caches.allocate(owner, nbytes, build)
            self.hold(lambda: caches.release(handle))
            return buffer
        handle, buffer = static.take(caches, owner, reuse, nbytes, build)
        self.hold(lambda: static.give(caches, reuse, handle, buffer))
        return buffer

    def _init_loop(self, loop: Any, reads: Mapping[str, Any], held: int) -> Generator[None, Any, Any]:
        """`loop.init`, retried at each later unit (`yield None`: not ready this round) while its KV reservation
        finds the pool busy and this run may wait (`kv_wait`); cancellation is honoured between tries."""
        while True:
            try:
                state = loop.init(reads, self)
            except KVPoolBusy:
                if not self.kv_wait:
                    raise
                self._release_held(held)  # whatever the failed init took before its reservation
                self.waiting_for_kv = True
                yield None
                self.check_cancelled()
                continue
            self.waiting_for_kv = False
            return state
