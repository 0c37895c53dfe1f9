"""MediaPool: upload checks and decodes run here, off the event loop, on a bounded set of threads.

Reading an upload's header or counting a video's packets is quick, but decoding a chat image or a
file past its header is not, and neither may stall /health or other requests: every route that
touches upload bytes hands that work to this pool. At most `workers` run at once and `queue` more
wait; past that a call is refused at once with EngineBusy (429 with Retry-After) rather than piling
up threads or memory behind a flood of uploads.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from vidloom.runtime.async_engine import EngineBusy

T = TypeVar("T")
MEDIA_RETRY_AFTER_S = 1  # a header check or an image decode takes well under a second


class MediaPool:
    """A fixed pool of `workers` threads with at most `queue` calls waiting for one."""

    def __init__(self, workers: int, queue: int) -> None:
        if workers < 1 or queue < 0:
            raise ValueError(f"media pool needs workers >= 1 and queue >= 0, got {workers} and {queue}")
        self.workers = workers
        self.queue = queue
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vidloom-media")
        self._lock = threading.Lock()
        self._pending = 0  # calls running or waiting, counted until their thread finishes them

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a pool thread; raises EngineBusy when `workers + queue` calls are already pending.

        A caller that goes away stops waiting, but a call already running finishes on its thread (and
        still counts until then), so the bound holds for the threads' real work.
        """
        with self._lock:
            if self._pending >= self.workers + self.queue:
                raise EngineBusy(f"{self._pending} uploads are being checked or decoded, the most this server "
                                 f"takes at once (media_workers={self.workers}, media_queue={self.queue})",
                                 MEDIA_RETRY_AFTER_S)
            self._pending += 1
        try:
            future: Future[T] = self._executor.submit(functools.partial(fn, *args))
        except RuntimeError:  # shut down
            self._done(None)
            raise
        future.add_done_callback(self._done)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Drop calls still waiting; running ones finish on their threads."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _done(self, _future: Future[Any] | None) -> None:
        with self._lock:
            self._pending -= 1
