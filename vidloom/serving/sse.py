"""Server-Sent Events for one job: its current state first, then progress and chunk events, then exactly one final
event."""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

from vidloom.serving.jobs import JobManager, JobUpdate, Subscription
from vidloom.serving.protocol import ChunkData, ProgressData, VideoObject

KEEPALIVE = b": keepalive\n\n"


def encode_event(event: str, data: str) -> bytes:
    """One SSE frame; `data` is single-line JSON, so it needs one `data:` line."""
    return f"event: {event}\ndata: {data}\n\n".encode()


def encode_update(update: JobUpdate) -> bytes:
    """`progress` carries step counts, `chunk` a decoded chunk's range; `completed` / `failed` / `cancelled`
    carry the video object."""
    record = update.record
    if update.event == "chunk" and update.chunk is not None:
        c = update.chunk
        chunk = ChunkData(
            id=record.id, index=c.index, total=c.total, start_frame=c.start_frame, stop_frame=c.stop_frame,
            start_s=round(c.start_frame / c.fps, 6), stop_s=round(c.stop_frame / c.fps, 6), fps=c.fps,
            missed_chunks=update.missed_chunks,
        )
        return encode_event("chunk", chunk.model_dump_json())
    if update.event == "progress":
        data = ProgressData(
            id=record.id, status=record.status, phase=update.phase, step=update.step, total=update.total,
            percent=record.progress,
        )
        return encode_event("progress", data.model_dump_json())
    if update.event == "reasoning":  # a unified model writing its prompt: the text as it is decoded
        return encode_event("reasoning", json.dumps({"id": record.id, "phase": update.phase, "text": update.text}))
    return encode_event(update.event, VideoObject.from_record(record).model_dump_json())


async def job_events(manager: JobManager, subscription: Subscription, keepalive_s: float) -> AsyncIterator[bytes]:
    """Stream until the final event; a quiet stretch sends an SSE comment so proxies keep the stream."""
    update = subscription.first
    queue = subscription.updates
    try:
        while True:
            yield encode_update(update)
            if update.event not in ("progress", "chunk", "reasoning") or queue is None:
                return
            while True:
                try:
                    update = await asyncio.wait_for(queue.get(), keepalive_s)
                    break
                except TimeoutError:
                    yield KEEPALIVE
    finally:
        if queue is not None:
            manager.unsubscribe(update.record.id, queue)
