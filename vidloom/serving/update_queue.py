"""UpdateQueue: one event-stream subscriber's bounded queue, which drops what a slow reader can best lose.

A reader that falls behind must not grow the server's memory, yet some updates matter more than
others. When the queue is at its bound, making room drops, in this order:

1. the oldest `progress` update: each one is a snapshot, the next carries the current state;
2. else two adjacent `reasoning` updates are merged into one (their texts joined: no text is lost,
   the reader just gets it in fewer, larger pieces);
3. else the oldest `chunk` update: the reader is told, as `missed_chunks` on the next chunk update it
   receives (chunks arrive in order and each says which frames exist, so nothing is lost for a
   player, only the notice of that chunk);

and the final update (completed, failed, cancelled) is always delivered, last.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

DROPPABLE = ("progress", "chunk")  # in the order they are dropped (reasoning is merged in between)


class UpdateQueue(asyncio.Queue):
    """An asyncio.Queue of updates (objects with an `event` name) holding at most `limit` of them."""

    def __init__(self, limit: int) -> None:
        super().__init__()  # unbounded for asyncio: the bound is enforced here, by dropping, never by waiting
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self.missed_chunks = 0  # chunk updates dropped since the last one delivered

    def put_nowait(self, item: Any) -> None:
        if self.qsize() >= self.limit:
            self._make_room()
        super().put_nowait(item)

    def get_nowait(self) -> Any:
        item = super().get_nowait()  # get() ends here too
        if item.event == "chunk" and self.missed_chunks:
            item = dataclasses.replace(item, missed_chunks=item.missed_chunks + self.missed_chunks)
            self.missed_chunks = 0
        return item

    def _make_room(self) -> None:
        items = self._queue  # type: ignore[attr-defined]  # the deque asyncio.Queue's own subclasses use
        for item in items:
            if item.event == "progress":
                items.remove(item)
                return
        for i in range(len(items) - 1):
            if items[i].event == items[i + 1].event == "reasoning":
                items[i] = dataclasses.replace(items[i], text=items[i].text + items[i + 1].text)
                del items[i + 1]
                return
        for kind in DROPPABLE:
            for item in items:
                if item.event == kind:
                    items.remove(item)
                    self.missed_chunks += kind == "chunk"
                    return
        # Only final updates queued: there is one per job, so a bound of 1 or more never gets here.
        raise AssertionError("update queue full of final updates")
