"""An action session (Python): a Cosmos3 world model driven chunk by chunk, as a controller drives it.

`gen.open_session(prompt, image=first, action=ActionInput(mode="policy" | "forward_dynamics", ...))` returns one;
`session.step(actions)` runs the next chunk and returns its frames (and, in policy mode, its actions). Chunk k
stands for one pipeline call: conditioned on the last frame of chunk k - 1 (the first: `image`), seeded
`seed + k`, with the same prompt and block. What carries over between chunks: the conditioning frame, and the
prefilled prompt prefixes (every chunk's caption is the same, so are its prefix K/V), held by the engine's cache
manager under the session id with the deployment's idle TTL (kv_session_ttl_s; 0 keeps nothing: each chunk
prefills again, same numbers). `close()` (or leaving a `with` block, or dropping the session) frees them.
"""

from __future__ import annotations

import dataclasses
import secrets
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from vidloom.core.action import ActionInput
from vidloom.core.errors import InvalidRequest
from vidloom.media.request_inputs import resolve_request

SESSION_MODES = ("forward_dynamics", "policy")  # a rollout from a frame; inverse_dynamics reads a whole video


@dataclass(frozen=True)
class ActionChunk:
    """One step of a session: chunk `index`'s frames (uint8 [chunk_size + 1, H, W, 3]; the first is the
    conditioning frame) and, in policy mode, its predicted actions (float32 [chunk_size, D])."""

    index: int
    frames: np.ndarray
    actions: np.ndarray | None
    metadata: dict[str, Any]


class ActionSession:
    """See the module docstring. Not thread-safe: one controller steps it."""

    def __init__(self, generator: Any, prompt: str, *, image: Any, action: ActionInput, **fields: Any) -> None:
        if not isinstance(action, ActionInput):
            raise InvalidRequest("action", f"must be an ActionInput, got {type(action).__name__}")
        if action.mode not in SESSION_MODES:
            raise InvalidRequest("action.mode", f"a session rolls out from a frame: {' or '.join(SESSION_MODES)}, "
                                                f"not {action.mode!r}")
        if image is None:
            raise InvalidRequest("image", "a session starts from a first frame; give image")
        self._generator, self.prompt, self.action = generator, prompt, action
        self._fields = dict(fields)
        self.seed = self._fields.pop("seed", None)
        if self.seed is None:
            self.seed = secrets.randbelow(2**31)
        self.session_id = f"session_{uuid.uuid4().hex}"
        self._frame: Any = image
        self.index = 0
        caches = generator.caches
        self._release = weakref.finalize(self, caches.release_session, self.session_id)
        probe = action.raw_actions
        if action.mode == "forward_dynamics" and probe is None:  # the actions come with each step
            from vidloom.families.cosmos3.actions import RAW_WIDTHS

            probe = np.zeros((1, RAW_WIDTHS.get(action.domain_name, 1)), dtype=np.float32)
        self._probe = probe
        self._check(raw_actions=probe)  # the block, the frame and the fields, before any work

    def sample_request(self) -> Any:
        """A request like the next chunk's (placeholder actions in forward_dynamics), for a server's limits."""
        return self.request(self._probe)

    def request(self, actions: Any = None) -> Any:
        """The resolved request of the next chunk (what `step` runs); InvalidRequest naming the field."""
        if not self._release.alive:
            raise InvalidRequest("session", f"{self.session_id} is closed")
        request = self._check(raw_actions=actions)
        return dataclasses.replace(request, action=dataclasses.replace(request.option("action"), session_id=self.session_id))

    def step(self, actions: Any = None) -> ActionChunk:
        """Run the next chunk: `actions` [T, D] for forward_dynamics, None for policy."""
        return self.advance(self._generator.run(self.request(actions)))

    def advance(self, output: Any) -> ActionChunk:
        """Take the output of `request(...)` run elsewhere (the server runs it on its engine) as the next chunk."""
        from PIL import Image

        chunk = ActionChunk(self.index, output.frames, output.actions, output.metadata)
        self._frame = Image.fromarray(output.frames[-1])  # the next chunk continues from the last frame
        self.index += 1
        return chunk

    @property
    def closed(self) -> bool:
        return not self._release.alive

    def close(self) -> None:
        """Free the session's resident prefixes now (idempotent)."""
        self._release()

    def __enter__(self) -> ActionSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, raw_actions: Any) -> Any:
        from vidloom.generator import build_request

        block = dataclasses.replace(self.action, raw_actions=raw_actions)
        card = self._generator.card
        request = build_request(card, self.prompt, image=self._frame, action=block, seed=self.seed + self.index,
                                request_id=self.session_id, **self._fields)
        return resolve_request(request, card)
