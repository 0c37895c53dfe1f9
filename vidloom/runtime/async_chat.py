"""The asyncio face of chat: admit on the caller's side, stream what the device worker decodes.

The worker thread steps the ChatEngine (AsyncEngine._work); items cross back to the event loop
through `call_soon_threadsafe`. Closing the iterator early (aclose, a client that left) cancels
the sequence, whose blocks return at the worker's next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, AsyncIterator, Callable

from vidloom.core.chat import ChatRequest, ChatResult, TokenDelta
from vidloom.runtime.chat_engine import ChatEngine, ChatItem, no_chat

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


class ChatFrontend:
    """AsyncEngine's chat side: the worker steps running chats together, between video steps.

    Mixed into AsyncEngine, whose `engine`, `_cond` (the worker's condition) and `_closing` it uses.
    """

    engine: Any
    _cond: threading.Condition
    _closing: bool

    @property
    def _chat(self) -> ChatEngine | None:
        return getattr(self.engine, "chat", None)

    def chat(self, request: ChatRequest) -> AsyncIterator[TokenDelta | ChatResult]:
        """Stream `request`'s TokenDeltas, then its ChatResult (see stream_chat).

        InvalidRequest("model") on a model without an ar_decode loop; InvalidRequest naming the field or
        CacheBudgetExceeded (KV pool full) before the first item; EngineClosed while shutting down.
        """
        chat = self._chat
        if chat is None:
            raise no_chat(self.engine.instance.card.model_id)
        if self._closing:
            from vidloom.runtime.async_engine import EngineClosed

            raise EngineClosed("engine is shutting down")
        return stream_chat(chat, request, self._wake)

    def chat_stats(self) -> dict[str, int]:
        """tokens_generated_total, kv_blocks_in_use, kv_blocks_total (zeros on a model without chat)."""
        chat = self._chat
        if chat is None:
            return {"tokens_generated_total": 0, "kv_blocks_in_use": 0, "kv_blocks_total": 0}
        stats = chat.stats()
        return {k: stats[k] for k in ("tokens_generated_total", "kv_blocks_in_use", "kv_blocks_total")}

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _chat_busy(self) -> bool:
        chat = self._chat
        return chat is not None and chat.has_work

    def _chat_step(self) -> None:
        """One decode step of every running chat sequence (their failures end them, not the worker)."""
        chat = self._chat
        if chat is None:
            return
        try:
            chat.step()
        except Exception:
            log.exception("chat decode step failed")
