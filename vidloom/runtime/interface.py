"""EngineAPI: the one engine interface the generator and the server use, whichever engine runs the steps.

`Engine` (one device, stepped in the caller's thread), `ParallelEngine` (a pool of ranks) and `AsyncEngine`
(a device worker thread over either) implement it. Every request kind (a GenerationRequest for video, image
and audio and a session's chunk, a ChatRequest, a SpeechRequest) enters through `submit`; a sync engine
returns the started run (step it, or `finish()` it), the AsyncEngine a JobHandle (`result()`). Either way
`runtime.results.result_of` turns the finished run's outputs into what the caller reads. A session (a world
model's, stepped chunk by chunk) is opened on a SessionHost, and its chunks are requests like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from vidloom.core.card import ModelCard
from vidloom.core.output import VideoOutput
from vidloom.core.request import GenerationRequest


@runtime_checkable
class EngineAPI(Protocol):
    """What callers may use of an engine; nothing else (no reaching inside, no `getattr` probing)."""

    instance: Any
    """The loaded model: a ModelInstance here, a PoolInstance (card, deploy, device) for a pool of ranks."""
    decoder: Any
    """The PagedDecoder of the AR loops (chat, speech, a reasoner); None where this engine runs none."""
    caches: Any
    """The CacheManager of resident KV and sessions; None where the caches live elsewhere (a pool's ranks)."""
    estimator: Callable[[Any], int] | None
    """Estimated peak bytes of a resolved request beyond the weights; None where the card gives none."""
    program: Any
    """The loaded Program (clients read its chat inputs and voices); None where it lives elsewhere (a pool's ranks)."""

    @property
    def card(self) -> ModelCard:
        """The model's card (defaults, capabilities, geometry)."""
        ...

    @property
    def compile_misses(self) -> int:
        """Requests that ran eagerly outside the compiled shape buckets (0 without compile)."""
        ...

    def submit(self, work: Any, on_event: Any = None) -> Any:
        """Validate `work` (InvalidRequest naming the field, before any work) and start or enqueue it."""
        ...

    def cancel(self, request_id: str) -> bool:
        """Stop a request at its next step boundary; False if unknown or finished."""
        ...

    def release_memory(self) -> Any:
        """Return cached device memory to the driver (between steps)."""
        ...

    def close(self) -> None:
        """Stop: cancel what runs, release worker processes; safe to call more than once."""
        ...


@dataclass(frozen=True)
class SessionHost:
    """What an interactive session (a card's BlockSpec.session, e.g. Cosmos3's ActionSession) is opened on."""

    card: ModelCard
    """The model's card: the session resolves each chunk's request against it."""
    caches: Any
    """The engine's CacheManager: the session's resident state lives there under its id until it closes."""
    run: Callable[[GenerationRequest], VideoOutput] | None = None
    """Runs a chunk to its output in this thread (the Python API); None on a server, which submits each chunk
    to its engine and hands the output to the session's `advance`."""
