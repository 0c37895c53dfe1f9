"""Step-level scheduling between resident requests. Pure Python: no torch, unit-tested with fakes."""

from __future__ import annotations

from collections import deque
from typing import Callable, Generic, Hashable, Protocol, TypeVar

POLICIES = ("fifo", "interleave", "batch")


class Keyed(Protocol):
    @property
    def key(self) -> Hashable: ...


T = TypeVar("T", bound=Keyed)


class QueueFull(Exception):
    """The waiting queue is at capacity; try again later."""


class Scheduler(Generic[T]):
    """A bounded waiting queue, `slots` resident items, and a policy that picks who steps next.

    fifo: the oldest resident item runs until it finishes (slots > 1 only pre-admits).
    interleave: resident items take one step each in turn, so short jobs are not
    stuck behind long ones.
    batch: like interleave, but the driver runs compatible steps of several resident items in one
    forward (`group`); `pick` names the item whose group goes next.
    """

    def __init__(self, policy: str = "fifo", slots: int = 1, queue_size: int = 16) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {policy!r}; known: {', '.join(POLICIES)}")
        if slots < 1 or queue_size < 0:
            raise ValueError(f"slots must be >= 1 and queue_size >= 0, got {slots} and {queue_size}")
        self.policy = policy
        self.slots = slots
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

    def enqueue(self, item: T) -> None:
        if len(self._waiting) >= self.queue_size:
            raise QueueFull(f"queue is full ({self.queue_size} waiting)")
        self._waiting.append(item)

    def admit(self, fits: Callable[[T], bool] | None = None) -> list[T]:
        """Move waiting items into free slots; returns the newly resident ones.

        `fits(item)` (when given) also asks for the item's room in what residents leave (memory admission;
        it reserves what it approves). Admission stops at the first item that does not fit: letting smaller
        ones overtake it could hold a large request back forever.
        """
        admitted = []
        while self._waiting and len(self._resident) < self.slots:
            if fits is not None and not fits(self._waiting[0]):
                break
            item = self._waiting.popleft()
            self._resident.append(item)
            admitted.append(item)
        return admitted

    def pick(self) -> T | None:
        """The resident item that should run its next step, or None if none is resident."""
        if not self._resident:
            return None
        if self.policy == "fifo":
            return self._resident[0]
        self._turn %= len(self._resident)
        item = self._resident[self._turn]
        self._turn += 1
        return item

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
        for i, item in enumerate(self._resident):
            if item.key == key:
                del self._resident[i]
                if i < self._turn:
                    self._turn -= 1  # keep the round-robin position on the next item
                return item
        return None

    def is_waiting(self, key: Hashable) -> bool:
        return any(item.key == key for item in self._waiting)
