"""`vidloom serve --store postgresql://...`: kill -9 mid-render keeps completed jobs; lost jobs fail or re-queue."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import BLOCKING_STEPS, ProcessServer, ThreadServer, create_video, wait_for_status
from vidloom.serving.config import ServeConfig

RENDER_STEPS = 150  # long enough to be mid-render when killed, short enough to run again in a test


@pytest.mark.slow
@pytest.mark.parametrize("lost_jobs", ["fail", "requeue"])
def test_kill_9_mid_render_keeps_completed_jobs_and_ends_or_reruns_the_lost_one(
    postgres, demo_engine, demo_cache: Path, tmp_path: Path, lost_jobs: str,
):
    url, data = postgres.new_database(), tmp_path / "data"
    first = ProcessServer(data, demo_cache, tmp_path / "serve.log", "--store", url, "--lost-jobs", lost_jobs)
    with httpx.Client(base_url=first.url, timeout=30) as client:
        done = create_video(client)["id"]
        wait_for_status(client, done, {"completed"})
        content = client.get(f"/v1/videos/{done}/content").content
        lost = create_video(client, num_inference_steps=RENDER_STEPS, seed=11)["id"]
        wait_for_status(client, lost, {"in_progress"})
    first.kill()
    assert not (data / "jobs.sqlite3").exists()  # the table lives in PostgreSQL

    config = ServeConfig(data_dir=data, store=url, lost_jobs=lost_jobs, max_steps=BLOCKING_STEPS,
                         recovery_interval_s=0.2, graceful_shutdown_s=2)
    with ThreadServer(demo_engine, config) as second, httpx.Client(base_url=second.url, timeout=30) as client:
        assert client.get(f"/v1/videos/{done}").json()["status"] == "completed"
        assert client.get(f"/v1/videos/{done}/content").content == content
        video = wait_for_status(client, lost, {"completed", "failed", "cancelled"}, timeout=60)
        if lost_jobs == "fail":
            assert video["status"] == "failed" and video["error"]["code"] == "server_restart", video
        else:
            assert video["status"] == "completed", video  # run again by the second server, same id
            assert client.get(f"/v1/videos/{lost}/content").content[4:8] == b"ftyp"
        assert {v["id"] for v in client.get("/v1/videos").json()["data"]} == {done, lost}


def test_an_unreachable_database_stops_the_start_with_one_line(demo_cache: Path, tmp_path: Path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "vidloom.cli", "serve", "--port", "0", "--data-dir", str(tmp_path),
         "--store", "postgresql://vidloom:hunter2@127.0.0.1:9/jobs"],
        capture_output=True, text=True, timeout=120, env={**__import__("os").environ, "VIDLOOM_CACHE": str(demo_cache)},
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot be reached" in errors[0] and "hunter2" not in proc.stderr, proc.stderr


def test_servers_sharing_a_store_see_cancel_and_delete_each_others_jobs(postgres, demo_engine, demo_cache: Path,
                                                                        tmp_path: Path):
    from vidloom.generator import VideoGenerator

    other_engine = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache).engine
    url, data = postgres.new_database(), tmp_path / "data"
    settings = dict(data_dir=data, store=url, max_steps=BLOCKING_STEPS, graceful_shutdown_s=2)
    with ThreadServer(demo_engine, ServeConfig(**settings)) as a, \
            ThreadServer(other_engine, ServeConfig(**settings)) as b, \
            httpx.Client(base_url=a.url, timeout=30) as on_a, httpx.Client(base_url=b.url, timeout=30) as on_b:
        job = create_video(on_a, num_inference_steps=BLOCKING_STEPS)["id"]
        wait_for_status(on_b, job, {"in_progress"})  # B reads A's progress from the shared table
        cancelled = on_b.post(f"/v1/videos/{job}/cancel").json()
        assert cancelled["status"] == "cancelled", cancelled  # A stopped it at a step boundary
        assert on_a.get(f"/v1/videos/{job}").json()["status"] == "cancelled"
        assert cancelled["completed_at"] is None and on_a.get(f"/v1/videos/{job}").json()["completed_at"] is None

        doomed = create_video(on_a, num_inference_steps=BLOCKING_STEPS)["id"]
        wait_for_status(on_a, doomed, {"in_progress"})
        assert on_b.delete(f"/v1/videos/{doomed}").json()["deleted"]
        deadline = time.monotonic() + 5  # A notices at its next control poll (every 0.25 s)
        while on_a.get(f"/v1/videos/{doomed}").status_code != 404:
            assert time.monotonic() < deadline, "A never noticed that B deleted its job"
            time.sleep(0.05)
        done = create_video(on_a)["id"]  # A's engine is free again: the deleted job stopped there
        assert wait_for_status(on_b, done, {"completed", "failed"}, timeout=30)["status"] == "completed"
        assert not list((data / "videos").glob(f"{doomed}*"))
