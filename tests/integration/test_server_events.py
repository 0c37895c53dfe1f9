"""Progress as Server-Sent Events, and cancelling or deleting queued and running jobs."""

from __future__ import annotations

import httpx

from tests.helpers.servers import BlockingJob, create_video, parse_sse, wait_for_status


def _stream_events(client: httpx.Client, video_id: str, on_first=None) -> list[tuple[str, dict]]:
    """Read the whole stream (it must end by itself); `on_first` runs once the first frame arrived."""
    lines: list[str] = []
    with client.stream("GET", f"/v1/videos/{video_id}/events", timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            lines.append(line)
            if line == "" and on_first is not None:
                on_first()
                on_first = None
    return parse_sse(lines)


def test_events_from_queued_to_completed(client: httpx.Client):
    blocker = BlockingJob(client)
    job = create_video(client)  # waits behind the blocker, so the stream sees every step
    events = _stream_events(client, job["id"], on_first=lambda: client.delete(f"/v1/videos/{blocker.id}"))

    names = [name for name, _ in events]
    assert names[-1] == "completed" and set(names[:-1]) == {"progress"}
    first = events[0][1]
    assert first["status"] == "queued" and first["percent"] == 0 and first["id"] == job["id"]
    steps = [(d["phase"], d["step"], d["total"]) for n, d in events if n == "progress" and d["phase"]]
    assert steps == [("denoise", 1, 2), ("denoise", 2, 2), ("decode", 1, 2), ("decode", 2, 2)]
    percents = [d["percent"] for n, d in events if n == "progress"]
    assert percents == sorted(percents) and percents[-1] < 100
    final = events[-1][1]
    assert final["status"] == "completed" and final["progress"] == 100 and final["id"] == job["id"]


def test_late_subscriber_gets_the_final_event_at_once(client: httpx.Client):
    job = create_video(client)
    wait_for_status(client, job["id"], {"completed"})
    events = _stream_events(client, job["id"])
    assert [name for name, _ in events] == ["completed"]
    assert events[0][1]["progress"] == 100


def test_subscriber_joining_mid_run_gets_current_state_first(client: httpx.Client):
    with BlockingJob(client) as blocker:
        wait_for_status(client, blocker.id, {"in_progress"})
        events = _stream_events(client, blocker.id, on_first=lambda: client.post(f"/v1/videos/{blocker.id}/cancel"))
    assert events[0][0] == "progress" and events[0][1]["status"] == "in_progress"
    assert [name for name, _ in events][-1] == "cancelled"
    assert sum(name != "progress" for name, _ in events) == 1


def test_cancel_a_queued_job(client: httpx.Client):
    with BlockingJob(client) as blocker:
        queued = create_video(client)
        cancelled = client.post(f"/v1/videos/{queued['id']}/cancel")
        assert cancelled.status_code == 200
        assert cancelled.json()["status"] == "cancelled"
        assert cancelled.json()["completed_at"] is None  # OpenAI: "when the job completed, if finished"
        assert [name for name, _ in _stream_events(client, queued["id"])] == ["cancelled"]
        assert client.get(f"/v1/videos/{queued['id']}/content").status_code == 409
        assert client.get(f"/v1/videos/{blocker.id}").json()["status"] == "in_progress"  # untouched


def test_cancel_a_running_job_frees_the_slot(client: httpx.Client):
    blocker = BlockingJob(client)
    cancelled = client.post(f"/v1/videos/{blocker.id}/cancel").json()
    assert cancelled["status"] == "cancelled" and cancelled["progress"] < 100
    assert cancelled["completed_at"] is None and client.get(f"/v1/videos/{blocker.id}").json()["completed_at"] is None
    again = client.post(f"/v1/videos/{blocker.id}/cancel")  # idempotent for a cancelled job
    assert again.status_code == 200 and again.json()["status"] == "cancelled"

    after = create_video(client)
    assert wait_for_status(client, after["id"], {"completed", "failed"})["status"] == "completed"
    finished = client.post(f"/v1/videos/{after['id']}/cancel")
    assert finished.status_code == 409 and finished.json()["error"]["code"] == "video_finished"


def test_delete_a_running_job_ends_its_stream(client: httpx.Client):
    blocker = BlockingJob(client)
    events = _stream_events(client, blocker.id, on_first=lambda: client.delete(f"/v1/videos/{blocker.id}"))
    assert [name for name, _ in events][-1] == "cancelled"
    assert client.get(f"/v1/videos/{blocker.id}").status_code == 404
    assert blocker.id not in [v["id"] for v in client.get("/v1/videos", params={"limit": 100}).json()["data"]]

    after = create_video(client)
    assert wait_for_status(client, after["id"], {"completed", "failed"})["status"] == "completed"
