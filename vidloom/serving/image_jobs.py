"""The image path of JobManager: requests answered in the same HTTP call, never stored (a mixin over its state)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from vidloom.core.errors import Cancelled
from vidloom.core.output import VideoOutput
from vidloom.core.request import GenerationRequest
from vidloom.media.request_inputs import resolve_request

if TYPE_CHECKING:
    from vidloom.serving.jobs import JobManager


class ImageRequests:
    """Run image requests to completion on the manager's engine, counted in its metrics."""

    async def generate_image(self: JobManager, request: GenerationRequest, kind: str = "image") -> VideoOutput:
        """Run a request to completion (not stored: images answer in the same HTTP call; `kind` "session_chunk":
        a world-model session's chunk, answered on its WebSocket)."""
        handle = self._submit(request)
        started, status = time.perf_counter(), "failed"
        self._images.add(request.request_id)
        try:
            output = await handle.result()
            status = "completed"
            return output
        except Cancelled:
            status = "cancelled"
            raise
        except asyncio.CancelledError:  # the client went away: free the slot
            self._engine.cancel(request.request_id)
            status = "cancelled"
            raise
        finally:
            self._images.discard(request.request_id)
            self.metrics.finished(kind, status, time.perf_counter() - started)

    async def generate_images(self: JobManager, requests: tuple[GenerationRequest, ...]) -> list[VideoOutput]:
        """Run an images call's `n` requests side by side (a batching policy may share their steps).

        All are validated before any is queued; if one fails, is refused (queue full) or the client
        leaves, the others are cancelled and the first error is raised.
        """
        for request in requests:
            self.limits.check(resolve_request(request, self.card), self._estimator)
        tasks: list[asyncio.Task[VideoOutput]] = []
        try:
            for request in requests:
                tasks.append(asyncio.ensure_future(self.generate_image(request)))
                await asyncio.sleep(0)  # submit now, in order, so a full queue refuses the later ones
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
