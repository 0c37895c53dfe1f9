"""The asyncio face of chat: admit on the caller's side, stream what the device worker decodes.

The worker thread steps the ChatEngine (AsyncEngine._work); items cross back to the event loop
through `call_soon_threadsafe`. Closing the iterator early (aclose, a client that left) cancels
the sequence, whose blocks return at the worker's next step.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Callable

from vidloom.core.chat import ChatRequest, ChatResult, TokenDelta
from vidloom.runtime.chat_engine import ChatEngine, ChatItem

log = logging.getLogger(__name__)


async def stream_chat(chat: ChatEngine, request: ChatRequest,
                      wake: Callable[[], None]) -> AsyncIterator[TokenDelta | ChatResult]:
    """Deltas then the ChatResult of `request`; admission errors raise before the first item."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[ChatItem] = asyncio.Queue()

    def sink(item: ChatItem) -> None:  # worker thread
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop is gone: nobody reads this stream any more
            log.debug("chat item for %s dropped: event loop closed", request.request_id)

    seq_id = chat.admit(request, sink)
    wake()
    ended = False
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                ended = True
                raise item
            if isinstance(item, ChatResult):
                ended = True
                yield item
                return
            yield item
    finally:
        if not ended and chat.cancel(seq_id):
            wake()
