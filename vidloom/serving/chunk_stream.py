"""Live streams of running jobs: a growing fragmented MP4 per job, fed by its chunk events, and readers that follow it.

Life of a job's stream (all state changes on the event loop thread; encoding on one writer thread):

- The first chunk event creates `videos/.<id>.growing.fmp4` (a "." name: recovery deletes it after a
  crash) and every chunk is appended as whole fragments; `committed` is the file's size after the
  last finished append, the most a reader may serve (never half a fragment).
- Completed: `seal` waits for the writes and renames the file to `videos/<id>.fmp4` before the job
  is marked completed, so a completed job's stream file is whole. Failed, cancelled or deleted:
  `abort` waits for the writes and deletes the file. Either way the stream ends and its readers,
  who hold their own descriptor of the file, finish what was committed and stop.
- A model that emits no chunks (Wan: the video exists only at the end) never creates a file; its
  readers get the finished mp4 once the job completes.
- A writer error (disk full) stops that stream only: the job goes on, readers end at the last
  committed fragment, and the completed job's `variant=stream` is then its finished mp4.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, BinaryIO, Callable

from vidloom.core.output import ChunkEvent
from vidloom.media.fmp4 import FragmentedMp4Writer

log = logging.getLogger(__name__)
READ_BYTES = 1 << 20  # a reader sends at most this much per read


@dataclass(frozen=True)
class ChunkInfo:
    """What an SSE `chunk` event says about a decoded chunk (the frames themselves go to the stream file)."""

    index: int
    total: int
    start_frame: int
    stop_frame: int
    fps: int

    @classmethod
    def of(cls, event: ChunkEvent) -> "ChunkInfo":
        c = event.chunk
        return cls(index=c.index, total=c.total, start_frame=c.start_frame, stop_frame=c.stop_frame, fps=event.fps)


@dataclass(eq=False)
class JobStream:
    """One running job's stream file and what its readers need to follow it."""

    job_id: str
    fd: int | None = None  # a read descriptor of the growing file; readers dup it (it survives rename/unlink)
    committed: int = 0  # bytes readers may serve
    ended: bool = False  # the job ended (the file is sealed or discarded): nothing more will come
    broken: bool = False  # the writer failed: the stream stops at `committed`, the job goes on
    sealed: bool = False  # ended with a whole file in place (the job completed)
    closed: bool = False  # the writer and the file are closed
    writer: FragmentedMp4Writer | None = None
    file: BinaryIO | None = None
    pending: asyncio.Future | None = None  # the last write handed to the writer thread
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self) -> None:
        await self._changed.wait()


class StreamFiles:
    """The live streams of one server's jobs; encoding runs on one thread, in chunk order."""

    def __init__(self, videos_dir: Path) -> None:
        self.videos_dir = videos_dir
        self._streams: dict[str, JobStream] = {}
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vidloom-stream-writer")
        self._tasks: set[asyncio.Task[None]] = set()  # aborted streams waiting for their writes to stop

    def growing_path(self, job_id: str) -> Path:
        return self.videos_dir / f".{job_id}.growing.fmp4"

    def open(self, job_id: str) -> JobStream:
        """Register a job whose chunks may come (at submission, so a reader can wait for the first one)."""
        stream = self._streams[job_id] = JobStream(job_id)
        return stream

    def get(self, job_id: str) -> JobStream | None:
        return self._streams.get(job_id)

    def feed(self, event: ChunkEvent) -> None:
        """Append a chunk's frames (asynchronously, on the writer thread)."""
        stream = self._streams.get(event.request_id)
        if stream is None or stream.ended or stream.broken:
            return
        frames = event.chunk.frames
        if stream.writer is None:
            if not self._start(stream, event.fps, frames.shape[2], frames.shape[1]):
                return
        writer = stream.writer
        assert writer is not None
        future = asyncio.get_running_loop().run_in_executor(self._writer, writer.write, frames)
        stream.pending = future
        future.add_done_callback(lambda done: self._written(stream, done))

    def _start(self, stream: JobStream, fps: int, width: int, height: int) -> bool:
        path = self.growing_path(stream.job_id)
        try:
            stream.file = open(path, "wb")
            stream.fd = os.open(path, os.O_RDONLY)
            stream.writer = FragmentedMp4Writer(stream.file, fps, width, height)
        except Exception:
            log.exception("cannot start the stream of %s; it is served once the job completes", stream.job_id)
            self._drop_file(stream, path)
            stream.broken = True
            stream.notify()
            return False
        return True

    def _written(self, stream: JobStream, done: asyncio.Future) -> None:
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            if not stream.broken:  # log once: later queued writes fail the same way
                log.error("writing the stream of %s failed (%s); it stops here", stream.job_id, error)
            stream.broken = True
        elif not stream.broken:
            stream.committed = max(stream.committed, done.result())
        stream.notify()

    async def seal(self, job_id: str) -> None:
        """The job completed: wait for its writes, then put the whole file at `<id>.fmp4`."""
        stream = self._streams.get(job_id)
        if stream is None:
            return
        await self._flush(stream)
        if not stream.ended and not stream.broken and stream.writer is not None:  # ended: deleted meanwhile
            try:
                os.replace(self.growing_path(job_id), self.videos_dir / f"{job_id}.fmp4")
                stream.sealed = True
            except OSError as exc:
                log.error("could not keep the stream of %s (%s); the finished mp4 is served instead", job_id, exc)
        if stream.file is not None and not stream.sealed:  # broken or aborted: nothing of it stays
            self.growing_path(job_id).unlink(missing_ok=True)
        self._end(stream)

    def abort(self, job_id: str) -> None:
        """The job failed, was cancelled or deleted: end the stream now, delete its file once writes stop."""
        stream = self._streams.get(job_id)
        if stream is None:
            return
        stream.ended = True
        stream.notify()
        self._streams.pop(job_id, None)
        task = asyncio.get_running_loop().create_task(self._discard(stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _discard(self, stream: JobStream) -> None:
        await self._flush(stream)
        self._end(stream)
        if stream.file is not None:
            self.growing_path(stream.job_id).unlink(missing_ok=True)

    async def _flush(self, stream: JobStream) -> None:
        """Wait for the queued writes of `stream`, then close its writer and file on the writer thread.

        Never raises: the job's own outcome must not depend on its stream (a failure breaks the stream).
        """
        try:
            if stream.pending is not None:
                await asyncio.wait([stream.pending])
            await asyncio.get_running_loop().run_in_executor(self._writer, self._close_files, stream)
        except Exception:
            log.exception("closing the stream of %s failed", stream.job_id)
            stream.broken = True

    @staticmethod
    def _close_files(stream: JobStream) -> None:
        if stream.closed:  # a delete racing the seal closes twice
            return
        stream.closed = True
        if stream.writer is not None:
            stream.writer.close()
        if stream.file is not None:
            stream.file.close()

    def _end(self, stream: JobStream) -> None:
        stream.ended = True
        if stream.fd is not None:
            os.close(stream.fd)
            stream.fd = None
        stream.notify()
        if self._streams.get(stream.job_id) is stream:
            self._streams.pop(stream.job_id, None)

    def _drop_file(self, stream: JobStream, path: Path) -> None:
        if stream.file is not None:
            stream.file.close()
        if stream.fd is not None:
            os.close(stream.fd)
        stream.file, stream.fd, stream.writer = None, None, None
        path.unlink(missing_ok=True)

    async def close(self) -> None:
        """Once every job ended (its stream sealed or aborted): finish the clean-ups, stop the writer thread."""
        for job_id in list(self._streams):
            self.abort(job_id)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self._writer.shutdown, True)


async def follow(stream: JobStream) -> AsyncIterator[bytes]:
    """The stream's bytes as they are committed, until it ends; yields nothing if it never started.

    Takes its own descriptor of the file at the first byte, so the file being renamed (sealed) or
    deleted (cancel, delete) meanwhile does not cut what was committed.
    """
    fd: int | None = None
    sent = 0
    try:
        while True:
            if fd is None and stream.fd is not None:
                fd = os.dup(stream.fd)
            if fd is not None and sent < stream.committed:
                data = await asyncio.to_thread(os.pread, fd, min(READ_BYTES, stream.committed - sent), sent)
                if data:
                    sent += len(data)
                    yield data
                    continue
            if (stream.ended or stream.broken) and (fd is None or sent >= stream.committed):
                return
            await stream.changed()
    finally:
        if fd is not None:
            os.close(fd)


async def stream_body(stream: JobStream, finished: Callable[[], Path | None]) -> AsyncIterator[bytes]:
    """A running job's stream for an HTTP response: what `follow` yields; if the job produced no stream
    (a model without chunks, or a broken writer), the file `finished()` names once the stream ended
    (the completed job's stream or mp4; None: it did not complete, and the response ends empty)."""
    sent = False
    async for data in follow(stream):
        sent = True
        yield data
    if sent:
        return
    while not stream.ended:  # a broken stream with nothing sent: the job may still complete
        await stream.changed()
    path = finished()
    if path is None:
        return
    try:
        file = open(path, "rb")
    except FileNotFoundError:  # deleted since
        return
    with file:
        while data := await asyncio.to_thread(file.read, READ_BYTES):
            yield data
