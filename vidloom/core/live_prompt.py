"""Live prompts: a running chunked request takes a new prompt from its next chunk on (Helios over the server).

The family's loader puts one LivePrompts in its instance's components (LIVE_PROMPTS); its chunk loop opens the
request's entry at init, takes the newest pending prompt at each chunk boundary and closes the entry when the loop
ends. A caller (the server's `/v1/videos/{id}/prompt` WebSocket, or Python) sets a prompt by request id; a request
that is not running (queued, finished or unknown) is refused, so nothing is kept for a request that never reads it.
"""

from __future__ import annotations

import threading

LIVE_PROMPTS = "live_prompts"
"""The instance component holding a model's LivePrompts (absent: the model takes no live prompt)."""


class LivePrompts:
    """Pending prompts of running requests, by request id; thread-safe (set from the server, taken by the loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, str | None] = {}

    def open(self, request_id: str) -> None:
        with self._lock:
            self._pending[request_id] = None

    def close(self, request_id: str) -> None:
        with self._lock:
            self._pending.pop(request_id, None)

    def set(self, request_id: str, prompt: str) -> bool:
        """Queue `prompt` for the request's next chunk (replacing one not yet taken); False if it is not running."""
        with self._lock:
            if request_id not in self._pending:
                return False
            self._pending[request_id] = prompt
            return True

    def take(self, request_id: str) -> str | None:
        """The prompt set since the last take, or None."""
        with self._lock:
            prompt = self._pending.get(request_id)
            if prompt is not None:
                self._pending[request_id] = None
            return prompt

    def running(self) -> int:
        """Requests whose entry is open (0 once every loop ended)."""
        with self._lock:
            return len(self._pending)
