"""What a job's subscribers receive, and the in-memory state of a running job."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from vidloom.serving.chunk_stream import ChunkInfo
from vidloom.serving.job_store import JobRecord
from vidloom.serving.progress import ProgressTracker
from vidloom.serving.update_queue import UpdateQueue


@dataclass(frozen=True)
class JobUpdate:
    """What event subscribers receive: a progress tick, a decoded chunk, or the job's final state."""

    event: str  # progress | chunk | completed | failed | cancelled
    record: JobRecord
    phase: str | None = None
    step: int = 0  # steps done in `phase`
    total: int = 0  # steps in `phase`
    chunk: ChunkInfo | None = None  # for "chunk"
    missed_chunks: int = 0  # chunk updates this subscriber's queue dropped before this one (see UpdateQueue)
    text: str = ""  # a `reasoning` update: the text decoded since the last one


@dataclass(frozen=True)
class Subscription:
    """The job's state at subscription time, then (while it runs) a queue of further updates."""

    first: JobUpdate
    updates: UpdateQueue | None  # None: the job had already finished


@dataclass
class LiveJob:
    """A job this server runs: its row as stored, its progress, and who listens."""

    record: JobRecord  # mirrors the stored row (every change is written through)
    tracker: ProgressTracker
    submitted: float  # perf_counter at submission, for the job latency metric
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    subscribers: set[UpdateQueue] = field(default_factory=set)
    # The text a unified model has written for its prompt so far (its `reasoning` updates joined), with their phase:
    # a stream that subscribes after they were published gets it first, so no reader misses its beginning.
    reasoning: list[str] = field(default_factory=list)
    reasoning_phase: str | None = None
