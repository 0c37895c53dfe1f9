"""ProgressTracker percentages and the SSE wire format."""

from __future__ import annotations

from vidloom.core.request import GenerationRequest
from vidloom.families.wan.demo import demo_card
from vidloom.serving.job_store import JobRecord
from vidloom.serving.jobs import JobUpdate
from vidloom.serving.progress import ProgressTracker, expected_units
from vidloom.serving.sse import encode_event, encode_update


def test_denoise_steps_and_decoded_frames_count_alike():
    request = GenerationRequest(prompt="x", num_inference_steps=6, num_frames=9)
    expected = expected_units(request, demo_card())
    assert expected == {"denoise": 6, "decode": 3}  # 9 frames = 3 latent frames
    tracker = ProgressTracker(expected)
    assert tracker.percent == 0
    assert [tracker.update("denoise", s, 6) for s in (1, 3, 6)] == [11, 33, 66]
    assert tracker.update("decode", 1, 3) == 77
    assert tracker.update("decode", 3, 3) == 99  # 100 only once the file is written
    assert (tracker.phase, tracker.step, tracker.total) == ("decode", 3, 3)


def test_unexpected_phases_and_totals_are_taken_from_events():
    tracker = ProgressTracker({"denoise": 4})
    assert tracker.update("refine", 1, 4) == 12  # 1 of 8 units
    assert tracker.update("denoise", 2, 2) == 50  # the run said 2 steps, not 4: 3 of 6


def test_sse_frames():
    assert encode_event("progress", '{"a":1}') == b'event: progress\ndata: {"a":1}\n\n'
    record = JobRecord(
        id="video_" + "0" * 32, model="m", status="in_progress", progress=42, created_at=1, completed_at=None,
        size="48x32", seconds="1", prompt="p", params={},
    )
    frame = encode_update(JobUpdate("progress", record, "denoise", 2, 5)).decode()
    assert frame.startswith("event: progress\ndata: {") and frame.endswith("}\n\n")
    assert '"percent":42' in frame and '"phase":"denoise"' in frame and '"step":2' in frame
    final = encode_update(JobUpdate("cancelled", record)).decode()
    assert final.startswith("event: cancelled\n") and '"object":"video"' in final


def test_quiet_streams_get_keepalives_and_end_after_the_final_event():
    import asyncio

    from vidloom.serving.jobs import Subscription
    from vidloom.serving.sse import KEEPALIVE, job_events

    record = JobRecord(
        id="video_" + "1" * 32, model="m", status="in_progress", progress=10, created_at=1, completed_at=None,
        size="48x32", seconds="1", prompt="p", params={},
    )

    class Manager:  # the one method job_events needs
        unsubscribed = False

        def unsubscribe(self, job_id, queue):
            self.unsubscribed = True

    async def run() -> list[bytes]:
        queue: asyncio.Queue = asyncio.Queue()
        manager = Manager()
        frames = []
        async for frame in job_events(manager, Subscription(JobUpdate("progress", record), queue), keepalive_s=0.01):
            frames.append(frame)
            if frame == KEEPALIVE and len(frames) == 2:
                queue.put_nowait(JobUpdate("failed", record))
        assert manager.unsubscribed
        return frames

    frames = asyncio.run(run())
    assert frames[0].startswith(b"event: progress") and frames[1] == KEEPALIVE
    assert frames[-1].startswith(b"event: failed") and len(frames) == 3


def test_a_phase_revealed_late_never_moves_the_percent_back():
    tracker = ProgressTracker({"rollout": 2, "decode": 3})
    assert tracker.update("rollout", 2, 6) == 22  # 2 of 9
    assert tracker.update("chunks", 1, 3) == 25  # 3 of 12
    assert tracker.update("kv_prefill", 0, 2) == 25  # 3 of 14 would be 21
    assert tracker.update("rollout", 6, 6) == 50  # 7 of 14


def test_a_late_subscriber_gets_the_reasoning_written_before_it_came():
    """A stream that subscribes after a unified model began writing its prompt first receives that text in one
    `reasoning` update, then the job's current state, then the updates that follow (none of the text is lost)."""
    import asyncio
    from types import SimpleNamespace

    from vidloom.serving.job_updates import LiveJob
    from vidloom.serving.jobs import JobManager

    record = JobRecord(
        id="video_" + "1" * 32, model="m", status="in_progress", progress=5, created_at=1, completed_at=None,
        size="48x32", seconds="1", prompt="p", params={},
    )
    live = LiveJob(record, ProgressTracker({"denoise": 4}), 0.0)
    manager = SimpleNamespace(_live={record.id: live}, _config=SimpleNamespace(sse_queue_size=8))

    async def subscribe():
        return JobManager.subscribe(manager, record.id)  # an UpdateQueue wants a running loop

    early = asyncio.run(subscribe())
    assert early.first.event == "progress" and early.updates.empty()  # nothing written yet: the state alone
    live.reasoning, live.reasoning_phase = ["a red ", "fox"], "reason"
    late = asyncio.run(subscribe())
    assert (late.first.event, late.first.text, late.first.phase) == ("reasoning", "a red fox", "reason")
    assert late.updates.get_nowait().event == "progress"
