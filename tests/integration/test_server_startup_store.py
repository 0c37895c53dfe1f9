"""`vidloom serve` restarting on a data dir in trouble: a full disk (a real one, a small tmpfs in a private
mount namespace) is named as such and leaves the database as it was; a database renamed while the server
ran keeps every job, and the -wal it leaves behind stops the restart with the way out."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import ProcessServer, create_video, wait_for_status

ROOT = Path(__file__).resolve().parents[2]
JOB = "video_" + "0" * 31 + "1"
# A previous server's data: one job with its result, then a clean stop ("clean") or a kill ("crash":
# no close, so -wal and -shm stay and the job stays active, for the restart to fail).
SEED = f"""
import os, sys
from pathlib import Path
from vidloom.serving.job_store import JobRecord
from vidloom.serving.sqlite_job_store import SqliteJobStore
store = SqliteJobStore(Path(sys.argv[1]))
store.add(JobRecord(id={JOB!r}, model="wan2.1-demo", status="queued", progress=0, created_at=1000,
                    completed_at=None, size="48x32", seconds="0.625", prompt="a cat", params={{}}))
(store.videos_dir / "{JOB}.mp4").write_bytes(b"mp4")
if sys.argv[2] == "crash":
    os._exit(0)
store.finish({JOB!r}, "completed", 1001)
store.close()
"""
CHECK = f"""
import sys
from pathlib import Path
from vidloom.serving.sqlite_job_store import SqliteJobStore
store = SqliteJobStore(Path(sys.argv[1]))
print(store.get({JOB!r}).status, sorted(p.name for p in store.videos_dir.iterdir()))
"""
SCRIPT = """
set -e
mount -t tmpfs -o size=1m tmpfs "$DISK"
"$PY" -c "$SEED" "$DISK/data" "$MODE"
dd if=/dev/zero of="$DISK/fill" bs=4096 2>/dev/null || true
rc=0; timeout 300 "$PY" -m vidloom.cli serve --port 0 --data-dir "$DISK/data" >"$OUT/serve.out" 2>"$OUT/serve.err" || rc=$?
echo $rc >"$OUT/serve.rc"
rm "$DISK/fill"
"$PY" -c "$CHECK" "$DISK/data" >"$OUT/check.out"
"""


def _private_mounts(probe_dir: Path) -> list[str]:
    """A command prefix that runs in a private mount namespace where tmpfs can be mounted, or skip."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    prefix = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-root-user"]
    probe = subprocess.run([*prefix, "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {probe_dir}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs in a private namespace here: {probe.stderr.strip()}")
    return prefix


@pytest.mark.parametrize("mode", ["clean", "crash"])
def test_restart_on_a_full_disk_says_the_disk_is_full(demo_cache, tmp_path, mode):
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    prefix = _private_mounts(disk)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VIDLOOM_CACHE": str(demo_cache), "PY": sys.executable,
           "DISK": str(disk), "OUT": str(out), "MODE": mode, "SEED": SEED, "CHECK": CHECK}
    run = subprocess.run([*prefix, "sh", "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    stderr = (out / "serve.err").read_text()
    assert (out / "serve.rc").read_text().strip() == "2", stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the disk is full" in errors[0] and "do not move it aside" in errors[0], stderr
    assert "Traceback" not in stderr and "serving" not in (out / "serve.out").read_text()
    # With room again, the database is as the last server left it, its result where it was.
    status = "completed" if mode == "clean" else "queued"
    assert (out / "check.out").read_text().split(None, 1) == [status, f"['{JOB}.mp4']\n"]


def test_a_database_renamed_while_serving_keeps_its_jobs_and_the_restart_says_where_they_are(demo_cache, tmp_path):
    data = tmp_path / "data"
    server = ProcessServer(data, demo_cache, tmp_path / "server.log")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            first = create_video(client)["id"]
            wait_for_status(client, first, {"completed"})
            (data / "jobs.sqlite3").rename(data / "moved.sqlite3")  # the operator, while it serves
            second = create_video(client)["id"]
            wait_for_status(client, second, {"completed"})
    finally:
        assert server.terminate() in (0, -15)

    restart = subprocess.run([sys.executable, "-m", "vidloom.cli", "serve", "--port", "0", "--data-dir", str(data)],
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "VIDLOOM_CACHE": str(demo_cache)})
    assert restart.returncode == 2, restart.stderr
    errors = [line for line in restart.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "jobs.sqlite3 is missing but jobs.sqlite3-wal is here" in errors[0], restart.stderr
    assert "put it back as jobs.sqlite3" in errors[0] and "serving" not in restart.stdout
    assert not (data / "orphans").exists()  # no result was moved away from its jobs

    (data / "moved.sqlite3").rename(data / "jobs.sqlite3")  # the way out the message names
    from vidloom.serving.sqlite_job_store import SqliteJobStore

    store = SqliteJobStore(data)
    try:
        assert {store.get(job).status for job in (first, second)} == {"completed"}  # both, even the later one
        assert {p.name for p in store.videos_dir.iterdir()} >= {f"{first}.mp4", f"{second}.mp4"}
    finally:
        store.close()
