"""Step-level scheduling between resident requests of every kind. Pure Python: no torch, unit-tested with fakes."""

from __future__ import annotations

from collections import deque
from typing import Callable, Generic, Hashable, Protocol, TypeVar

POLICIES = ("fifo", "interleave", "batch")


DEFAULT_DECODE_SLOTS = 64
"""Resident AR sequences (chats) at most: each decode forward carries all of them, so this bounds its
width (vLLM's max_num_seqs plays the same role); the paged KV pool bounds their tokens."""


class Keyed(Protocol):
    """A scheduled item; one that sets `decoder = True` (a chat) takes a decode slot, not a slot."""

    @property
    def key(self) -> Hashable: ...


T = TypeVar("T", bound=Keyed)


class QueueFull(Exception):
    """The waiting queue is at capacity; try again later."""


def is_decoder(item: object) -> bool:
    """An AR sequence (a chat): holds a decode slot and steps in every round's decode forward."""
    return bool(getattr(item, "decoder", False))


def is_decoding(item: object) -> bool:
    """A generation request inside a paged decode loop (a reasoner writing its prompt): it steps with the
    decoders until its loop ends, and takes no policy turn meanwhile."""
    return bool(getattr(item, "decoding", False))


def is_waiting(item: object) -> bool:
    """A resident request whose next loop waits for paged KV blocks that running sequences hold (a talker finding
    its pool busy): it retries in every round's decode pass, and takes no policy turn meanwhile."""
    return bool(getattr(item, "waiting", False))


class Scheduler(Generic[T]):
    """One bounded waiting queue for every request kind, two kinds of resident places, and a policy.

    Generation requests (video, image, reason-then-generate) take one of `slots`; AR sequences
    (chats) one of `decode_slots`. Both wait in the same queue (queue_size counts them together,
    admitted oldest first, a full kind not blocking the other) and both count as resident.

    How the driver mixes the two kinds of work, each round of the device worker:
    1. one decode step of every running AR sequence, in one forward: the chats, and any generation
       request that is in a paged decode loop (a reasoner writing its prompt); new sequences prefill
       in the same forward, so they join and leave between steps;
    2. then one unit of generation work (a denoise step or a component node), picked by the policy.
    A decode step is cheap and latency-bound while a denoise step is long: running the decode step
    every round bounds a chat's time to first token and time between tokens by one denoise step,
    and costs the denoise side one decode forward per step (bench/chat_video_mix.py measures both).

    The policy picks among generation requests only (`pick`):
    fifo: the oldest resident item runs until it finishes (slots > 1 only pre-admits).
    interleave: resident items take one step each in turn, so short jobs are not
    stuck behind long ones.
    batch: like interleave, but the driver runs compatible steps of several resident items in one
    forward (`group`); `pick` names the item whose group goes next.
    """

    def __init__(self, policy: str = "fifo", slots: int = 1, queue_size: int = 16,
                 decode_slots: int = DEFAULT_DECODE_SLOTS) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {policy!r}; known: {', '.join(POLICIES)}")
        if slots < 1 or queue_size < 0 or decode_slots < 1:
            raise ValueError(f"slots and decode_slots must be >= 1 and queue_size >= 0, got {slots}, "
                             f"{decode_slots} and {queue_size}")
        self.policy = policy
        self.slots = slots
        self.decode_slots = decode_slots
        self.queue_size = queue_size
        self._waiting: deque[T] = deque()
        self._resident: list[T] = []
        self._turn = 0  # interleave: index of the resident item that steps next

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def resident(self) -> int:
        return len(self._resident)

    def resident_of(self, decoder: bool) -> int:
        """Resident AR sequences (decoder=True) or generation requests (False)."""
        return sum(is_decoder(item) == decoder for item in self._resident)

    def enqueue(self, item: T) -> None:
        if len(self._waiting) >= self.queue_size:
            raise QueueFull(f"queue is full ({self.queue_size} waiting)")
        self._waiting.append(item)

    def admit(self, fits: Callable[[T], bool] | None = None) -> list[T]:
        """Move waiting items into free places of their kind, oldest first; returns the newly resident ones.

        `fits(item)` (when given) also asks for the item's room in what residents leave (memory admission, one
        ledger for every kind: a chat's decode working set counts as a video's estimate does; it reserves what
        it approves). An item that does not fit holds back the items of its kind behind it (letting smaller ones
        overtake could hold a large request back forever); the other kind is not blocked by it.
        """
        free = {False: self.slots - self.resident_of(False), True: self.decode_slots - self.resident_of(True)}
        blocked = {False: False, True: False}
        admitted = []
        for item in list(self._waiting):
            decoder = is_decoder(item)
            if free[decoder] <= 0:
                continue
            if blocked[decoder] or (fits is not None and not fits(item)):
                blocked[decoder] = True
                continue
            free[decoder] -= 1
            self._waiting.remove(item)
            self._resident.append(item)
            admitted.append(item)
        return admitted

    def round(self) -> tuple[list[T], T | None]:
        """One round of work (see the class docstring): the residents whose decode steps run together in this
        round's forward (decoders, and generation requests that are `decoding`; those `waiting` for KV blocks
        retry there), oldest first, then the generation request that runs one unit after it (`pick`)."""
        decode = [item for item in self._resident if is_decoder(item) or is_decoding(item) or is_waiting(item)]
        return decode, self.pick()

    def pick(self) -> T | None:
        """The resident generation request that should run its next unit, or None (AR sequences and requests
        that are `decoding` take no turn: every round steps them together)."""
        # A waiting item takes no turn (under fifo, the next oldest runs: it may hold the blocks awaited).
        generating = [item for item in self._resident if not is_decoder(item) and not is_waiting(item)]
        if not generating:
            return None
        if self.policy == "fifo":  # the oldest runs to its end; while it decodes, its decode steps are its turns
            return None if is_decoding(generating[0]) else generating[0]
        for _ in generating:
            self._turn %= len(generating)
            item = generating[self._turn]
            self._turn += 1
            if not is_decoding(item):
                return item
        return None

    def residents(self) -> list[T]:
        """Resident items, oldest first."""
        return list(self._resident)

    def group(self, first: T, keys: dict[Hashable, Hashable | None], max_size: int) -> list[T]:
        """`first` plus up to max_size - 1 other residents (oldest first) whose batch key equals its own.

        `keys` maps item key -> batch key; None means "runs alone" (never grouped).
        """
        mine = keys.get(first.key)
        if mine is None:
            return [first]
        others = [item for item in self._resident if item is not first and keys.get(item.key) == mine]
        return [first, *others[: max_size - 1]]

    def remove(self, key: Hashable) -> T | None:
        """Drop an item (finished, failed or cancelled) wherever it is; returns it if found."""
        for i, item in enumerate(self._waiting):
            if item.key == key:
                del self._waiting[i]
                return item
        generating = [item for item in self._resident if not is_decoder(item)]
        for i, item in enumerate(self._resident):
            if item.key == key:
                del self._resident[i]
                if not is_decoder(item) and generating.index(item) < self._turn:
                    self._turn -= 1  # keep the round-robin position on the next item
                return item
        return None

    def is_waiting(self, key: Hashable) -> bool:
        return any(item.key == key for item in self._waiting)
