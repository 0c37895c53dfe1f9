"""A slow event-stream reader: progress ticks go first, chunk notices are counted when dropped, the final one stays."""

from __future__ import annotations

import asyncio

import pytest

from vidloom.serving.chunk_stream import ChunkInfo
from vidloom.serving.job_store import JobRecord
from vidloom.serving.jobs import JobUpdate
from vidloom.serving.sse import encode_update
from vidloom.serving.update_queue import UpdateQueue

RECORD = JobRecord(id="video_" + "2" * 32, model="m", status="in_progress", progress=5, created_at=1,
                   completed_at=None, size="32x32", seconds="1", prompt="p", params={})


def _progress(step: int) -> JobUpdate:
    return JobUpdate("progress", RECORD, "rollout", step, 9)


def _chunk(index: int) -> JobUpdate:
    return JobUpdate("chunk", RECORD, chunk=ChunkInfo(index, 9, 8 * index, 8 * index + 8, 16))


def _drain(queue: UpdateQueue) -> list[JobUpdate]:
    return [queue.get_nowait() for _ in range(queue.qsize())]


def test_progress_is_dropped_before_any_chunk_and_the_final_update_always_fits():
    queue = UpdateQueue(3)
    for update in (_progress(1), _chunk(0), _progress(2), _chunk(1), _progress(3), JobUpdate("completed", RECORD)):
        queue.put_nowait(update)
    got = _drain(queue)
    assert [u.event for u in got] == ["chunk", "chunk", "completed"]
    assert [u.chunk.index for u in got[:2]] == [0, 1] and all(u.missed_chunks == 0 for u in got)


def test_dropped_chunks_are_reported_on_the_next_chunk_delivered():
    queue = UpdateQueue(2)
    for index in range(5):
        queue.put_nowait(_chunk(index))
    queue.put_nowait(JobUpdate("cancelled", RECORD))
    got = _drain(queue)
    assert [(u.event, u.chunk and u.chunk.index, u.missed_chunks) for u in got] == [
        ("chunk", 4, 4), ("cancelled", None, 0)]
    assert '"missed_chunks":4' in encode_update(got[0]).decode()


def test_the_queue_never_grows_past_its_limit_even_for_a_waiting_reader():
    async def run() -> list[str]:
        queue = UpdateQueue(2)
        waiting = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)
        for step in range(10):
            queue.put_nowait(_progress(step))
            assert queue.qsize() <= 2
        first = await waiting  # woken by the first put, it takes what is at the front when it runs
        return [first.step, *(u.step for u in _drain(queue))]

    assert asyncio.run(run()) == [8, 9]  # the newest ticks


def test_sse_chunk_frame_names_the_frame_and_time_range():
    frame = encode_update(_chunk(1)).decode()
    assert frame.startswith("event: chunk\n")
    for part in ('"index":1', '"total":9', '"start_frame":8', '"stop_frame":16', '"start_s":0.5', '"stop_s":1.0',
                 '"fps":16'):
        assert part in frame


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="limit"):
        UpdateQueue(0)


def test_reasoning_updates_are_merged_not_lost_when_full():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Update:
        event: str
        text: str = ""

    queue = UpdateQueue(3)
    for piece in ("a", "b", "c", "d", "e"):
        queue.put_nowait(Update("reasoning", piece))
    queue.put_nowait(Update("completed"))
    got = [queue.get_nowait() for _ in range(queue.qsize())]
    assert "".join(u.text for u in got if u.event == "reasoning") == "abcde"
    assert got[-1].event == "completed" and len(got) <= 3
