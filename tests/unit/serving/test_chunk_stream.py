"""StreamFiles and its readers without a server: sealing, aborting, a failing writer, a model without chunks."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import av
import numpy as np
from vidloom.core.output import ChunkEvent, VideoChunk
from vidloom.media import fmp4
from vidloom.serving.chunk_stream import StreamFiles, follow, stream_body

JOB = "video_" + "3" * 32
FRAMES = np.random.default_rng(0).integers(0, 256, (9, 16, 16, 3), dtype=np.uint8)
RANGES = [(0, 1), (1, 5), (5, 9)]


def _event(index: int) -> ChunkEvent:
    a, b = RANGES[index]
    return ChunkEvent(JOB, VideoChunk(index=index, total=3, start_frame=a, frames=FRAMES[a:b]), fps=8)


def _frames(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


async def _read(stream) -> bytes:
    return b"".join([piece async for piece in follow(stream)])


async def _body(stream, finished) -> bytes:
    return b"".join([piece async for piece in stream_body(stream, finished)])


async def _until(check) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError


def test_a_reader_from_the_start_gets_the_sealed_file_byte_for_byte(tmp_path: Path):
    async def run() -> bytes:
        streams = StreamFiles(tmp_path)
        stream = streams.open(JOB)
        reader = asyncio.ensure_future(_read(stream))
        for index in range(3):
            streams.feed(_event(index))
        await streams.seal(JOB)
        data = await reader
        assert streams.get(JOB) is None and stream.sealed
        await streams.close()
        return data

    data = asyncio.run(run())
    assert data == (tmp_path / f"{JOB}.fmp4").read_bytes() and _frames(data) == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{JOB}.fmp4"]


def test_abort_ends_readers_at_a_whole_fragment_and_deletes_the_file(tmp_path: Path):
    async def run() -> bytes:
        streams = StreamFiles(tmp_path)
        stream = streams.open(JOB)
        streams.feed(_event(0))
        streams.feed(_event(1))
        await _until(lambda: stream.committed > 0)
        reader = asyncio.ensure_future(_read(stream))
        await asyncio.sleep(0)
        streams.abort(JOB)  # cancelled, failed or deleted
        streams.feed(_event(2))  # a late chunk of the stopped job: ignored
        data = await reader
        await streams.close()
        return data

    data = asyncio.run(run())
    assert _frames(data) in (1, 5)  # what was committed when the job ended
    assert list(tmp_path.iterdir()) == []


def test_a_failing_writer_stops_the_stream_not_the_job(tmp_path: Path, monkeypatch):
    calls = []
    append = fmp4.FragmentedMp4Writer._append

    def failing(self, muxed, *, with_init):
        calls.append(with_init)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return append(self, muxed, with_init=with_init)

    monkeypatch.setattr(fmp4.FragmentedMp4Writer, "_append", failing)
    finished = tmp_path / "finished.mp4"
    finished.write_bytes(b"the finished mp4")

    async def run() -> tuple[bytes, bytes]:
        streams = StreamFiles(tmp_path)
        stream = streams.open(JOB)
        early = asyncio.ensure_future(_read(stream))
        for index in range(3):
            streams.feed(_event(index))
        got = await early  # ends at the last whole fragment while the job goes on
        late = asyncio.ensure_future(_body(stream, lambda: finished))
        await streams.seal(JOB)
        await streams.close()
        return got, await late

    got, late = asyncio.run(run())
    assert _frames(got) == 1 and calls == [True, False]  # the third chunk was refused, never appended
    assert late == got  # a later reader gets what was committed, not the finished file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["finished.mp4"]  # no growing or sealed stream left


def test_a_job_without_chunks_streams_its_finished_file(tmp_path: Path):
    finished = tmp_path / "whole.mp4"
    finished.write_bytes(b"x" * 3000)

    async def run() -> bytes:
        streams = StreamFiles(tmp_path)
        stream = streams.open(JOB)
        body = asyncio.ensure_future(_body(stream, lambda: finished))
        await asyncio.sleep(0.05)
        assert not body.done()  # waits for the job
        await streams.seal(JOB)
        await streams.close()
        return await body

    assert asyncio.run(run()) == b"x" * 3000


def test_the_reader_of_a_job_that_did_not_complete_gets_nothing(tmp_path: Path):
    async def run() -> bytes:
        streams = StreamFiles(tmp_path)
        stream = streams.open(JOB)
        body = asyncio.ensure_future(_body(stream, lambda: None))
        streams.abort(JOB)
        await streams.close()
        return await body

    assert asyncio.run(run()) == b""
