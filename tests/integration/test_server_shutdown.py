"""`vidloom serve` as a process: SIGTERM drains jobs and ends every event stream; a corrupt database stops the start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.helpers.servers import BlockingJob, ProcessServer, create_video

KEY = "sk-shutdown-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


class EventStream(threading.Thread):
    """Reads one job's SSE stream to its end, noting when each event arrived."""

    def __init__(self, url: str, video_id: str, headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.url, self.video_id, self.headers = url, video_id, headers
        self.events: list[tuple[str, dict, float]] = []
        self.subscribed = threading.Event()
        self.start()

    def run(self) -> None:
        name = None
        url = f"{self.url}/v1/videos/{self.video_id}/events"
        with httpx.stream("GET", url, headers=self.headers, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("event:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and name:
                    self.events.append((name, json.loads(line.split(":", 1)[1]), time.monotonic()))
                    self.subscribed.set()

    @property
    def final(self) -> tuple[str, dict, float]:
        assert self.events and self.events[-1][0] != "progress", self.events[-3:]
        return self.events[-1]


def test_sigterm_fails_queued_jobs_at_once_and_running_ones_after_the_grace(
    demo_cache: Path, tmp_path: Path, monkeypatch,
):
    grace = 2.0
    monkeypatch.setenv("VIDLOOM_API_KEY", KEY)  # the key from the environment, as the README recommends
    server = ProcessServer(tmp_path / "data", demo_cache, tmp_path / "serve.log", "--shutdown-grace", str(grace))
    assert httpx.get(f"{server.url}/v1/videos").status_code == 401
    with httpx.Client(base_url=server.url, timeout=30, headers=AUTH) as client:
        running = BlockingJob(client).id
        queued = create_video(client)["id"]
    streams = {job: EventStream(server.url, job, AUTH) for job in (running, queued)}
    assert all(s.subscribed.wait(30) for s in streams.values())

    sent = time.monotonic()
    code = server.terminate()
    exited = time.monotonic() - sent
    for stream in streams.values():
        stream.join(10)
        name, video, at = stream.final  # every stream got its final event before the server went
        assert name == "failed" and video["error"]["code"] == "server_restart", video
    assert streams[running].final[2] - sent >= 0.9 * grace  # the running job had its grace period
    assert code in (0, -15)
    # Seen: ~2.5 s. uvicorn alone would wait its own timeout for the open streams and then cut them.
    assert exited < grace + 8, exited
    log = (tmp_path / "serve.log").read_text()
    assert "timeout graceful shutdown exceeded" not in log and "Application shutdown complete" in log


def test_sigterm_lets_a_running_job_finish_within_the_grace(demo_cache: Path, tmp_path: Path):
    data = tmp_path / "data"
    server = ProcessServer(data, demo_cache, tmp_path / "serve.log", "--shutdown-grace", "60", "--api-key", KEY)
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    with httpx.Client(base_url=server.url, timeout=30, headers=AUTH) as client:
        job = create_video(client, num_inference_steps=40)["id"]
    stream = EventStream(server.url, job, AUTH)
    assert stream.subscribed.wait(30)
    sent = time.monotonic()
    code = server.terminate()
    exited = time.monotonic() - sent
    stream.join(10)
    assert stream.final[0] == "completed", stream.events[-3:]
    assert stream.final[2] > sent  # it was still running when the signal came
    assert (data / "videos" / f"{job}.mp4").stat().st_size > 0
    assert code in (0, -15) and exited < 30, exited  # the job's time, not the 60 s grace


def test_corrupt_database_is_one_line_and_exit_2_before_serving(demo_cache: Path, tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "jobs.sqlite3").write_bytes(b"not a database at all " * 64)
    env = {**os.environ, "VIDLOOM_CACHE": str(demo_cache)}
    proc = subprocess.run(
        [sys.executable, "-m", "vidloom.cli", "serve", "--port", "0", "--data-dir", str(data)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "jobs.sqlite3" in errors[0] and "Traceback" not in proc.stderr, proc.stderr
    assert "serving" not in proc.stdout
    assert (data / "jobs.sqlite3").read_bytes().startswith(b"not a database")  # left for the operator
