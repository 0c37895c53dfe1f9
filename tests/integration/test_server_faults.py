"""Storage faults on a running server: a full disk, a read-only videos folder, downloads racing deletes."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import SMALL, BlockingJob, ThreadServer, create_video, wait_for_status
from vidloom.serving import video_routes
from vidloom.serving.file_response import OpenFileResponse

_WRITES = re.compile(r"^\s*(INSERT|UPDATE|DELETE)", re.IGNORECASE)


class FlakyDisk:
    """The store's SQLite connection, except that while `full` statements matching `pattern` fail (disk full)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.full = False
        self.pattern = _WRITES

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if self.full and self.pattern.search(sql):
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def close(self) -> None:
        self._db.close()


def _flaky(server: ThreadServer, monkeypatch: pytest.MonkeyPatch) -> FlakyDisk:
    store = server.app.state.jobs.store
    disk = FlakyDisk(store._db)
    monkeypatch.setattr(store, "_db", disk)
    return disk


def _completed(client: httpx.Client) -> tuple[str, bytes]:
    video_id = create_video(client)["id"]
    wait_for_status(client, video_id, {"completed"})
    return video_id, client.get(f"/v1/videos/{video_id}/content").content


def test_full_disk_fails_the_job_refuses_creates_and_recovers(start_server, monkeypatch):
    server = start_server()
    disk = _flaky(server, monkeypatch)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        with BlockingJob(client, steps=400) as job:
            disk.full = True
            video = wait_for_status(client, job.id, {"completed", "failed", "cancelled"}, timeout=20)
            assert video["status"] == "failed" and video["error"]["code"] == "storage_error", video
            listed = {v["id"]: v["status"] for v in client.get("/v1/videos").json()["data"]}
            assert listed[job.id] == "failed"  # the list agrees with the job, though the row could not be written
            refused = client.post("/v1/videos", json={"prompt": "a cat", **SMALL})
            assert refused.status_code == 507, refused.text
            error = refused.json()["error"]
            assert error["code"] == "storage_full" and "disk is full" in error["message"]
            deadline = time.monotonic() + 10
            while client.get("/health").json()["in_flight"]:  # the stopped job freed its slot
                assert time.monotonic() < deadline
                time.sleep(0.05)

            disk.full = False  # space is back: the worker serves again, the stale row is written
            again = create_video(client)
            assert wait_for_status(client, again["id"], {"completed", "failed"})["status"] == "completed"
            assert server.app.state.jobs.store.get(job.id).status == "failed"
        assert 'vidloom_rejected_requests_total{reason="storage_error"} 1.0' in client.get("/metrics").text


def test_cancel_does_not_hang_when_the_final_state_cannot_be_stored(start_server, monkeypatch):
    server = start_server()
    disk = _flaky(server, monkeypatch)
    disk.pattern = re.compile(r"completed_at = \?")  # only the final-status write fails
    store = server.app.state.jobs.store
    with httpx.Client(base_url=server.url, timeout=30) as client, BlockingJob(client) as job:
        disk.full = True
        started = time.monotonic()
        cancelled = client.post(f"/v1/videos/{job.id}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        assert time.monotonic() - started < 4  # no cancel_wait_s timeout (5 s)
        assert client.get(f"/v1/videos/{job.id}").json()["status"] == "cancelled"
        assert "event: cancelled" in client.get(f"/v1/videos/{job.id}/events").text
        assert store.get(job.id).status == "in_progress"  # not yet written...
        disk.full = False
        create_video(client)
        assert store.get(job.id).status == "cancelled"  # ...and written once the store takes writes again


def test_download_racing_a_delete_gets_the_whole_file_or_404(client: httpx.Client, server, monkeypatch):
    video_id, mp4 = _completed(client)
    manager = server.app.state.jobs

    class DeletedAfterOpen(OpenFileResponse):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            assert manager.delete(video_id)  # the DELETE lands after the route opened the file

    monkeypatch.setattr(video_routes, "OpenFileResponse", DeletedAfterOpen)
    response = client.get(f"/v1/videos/{video_id}/content")
    assert response.status_code == 200 and response.content == mp4
    monkeypatch.undo()
    assert client.get(f"/v1/videos/{video_id}/content").status_code == 404
    assert not list(manager.store.videos_dir.glob(f"*{video_id}*"))

    video_id, mp4 = _completed(client)  # and with real concurrent clients
    statuses: list[int] = []

    def download() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as own:
            for _ in range(10):
                got = own.get(f"/v1/videos/{video_id}/content")
                statuses.append(got.status_code)
                assert got.status_code == 404 or got.content == mp4

    threads = [threading.Thread(target=download) for _ in range(4)]
    for thread in threads:
        thread.start()
    assert client.delete(f"/v1/videos/{video_id}").status_code == 200
    for thread in threads:
        thread.join()
    assert len(statuses) == 40 and set(statuses) <= {200, 404}, statuses


def test_head_content(client: httpx.Client):
    video_id, mp4 = _completed(client)
    head = client.head(f"/v1/videos/{video_id}/content")
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(mp4) and head.content == b""
    assert client.head("/v1/videos/video_" + "0" * 32 + "/content").status_code == 404


def test_delete_with_a_read_only_videos_folder_changes_nothing(client: httpx.Client, server, monkeypatch):
    video_id, mp4 = _completed(client)
    videos = server.app.state.jobs.store.videos_dir
    real_replace = Path.replace

    def read_only(self: Path, target: Path) -> Path:
        if self.parent == videos:
            raise PermissionError(13, "Permission denied", str(self))
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", read_only)
    refused = client.delete(f"/v1/videos/{video_id}")
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "storage_unavailable" and "not deleted" in error["message"]
    assert "Permission denied" in error["message"] and str(videos) not in error["message"]
    assert client.get(f"/v1/videos/{video_id}").json()["status"] == "completed"  # neither row nor file went
    assert client.get(f"/v1/videos/{video_id}/content").content == mp4
    monkeypatch.undo()
    assert client.delete(f"/v1/videos/{video_id}").status_code == 200
    assert client.get(f"/v1/videos/{video_id}").status_code == 404 and not list(videos.glob(f"*{video_id}*"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_delete_with_a_chmod_read_only_videos_folder(client: httpx.Client, server):
    video_id, mp4 = _completed(client)
    videos = server.app.state.jobs.store.videos_dir
    videos.chmod(0o555)
    try:
        assert client.delete(f"/v1/videos/{video_id}").status_code == 503
        assert client.get(f"/v1/videos/{video_id}/content").content == mp4
    finally:
        videos.chmod(0o755)
    assert client.delete(f"/v1/videos/{video_id}").status_code == 200


def test_delete_whose_row_cannot_go_keeps_the_files(start_server, monkeypatch):
    server = start_server()
    disk = _flaky(server, monkeypatch)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        video_id, mp4 = _completed(client)
        disk.full = True
        refused = client.delete(f"/v1/videos/{video_id}")
        assert refused.status_code == 507 and refused.json()["error"]["code"] == "storage_full"
        assert client.get(f"/v1/videos/{video_id}/content").content == mp4  # the files were put back
        disk.full = False
        assert client.delete(f"/v1/videos/{video_id}").status_code == 200


def test_a_failing_store_read_is_503_not_500(start_server, monkeypatch):
    server = start_server()
    store = server.app.state.jobs.store

    def broken(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store, "page", broken)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.get("/v1/videos")
        assert response.status_code == 503 and response.json()["error"]["code"] == "storage_unavailable"
        assert "disk I/O error" in response.json()["error"]["message"]
