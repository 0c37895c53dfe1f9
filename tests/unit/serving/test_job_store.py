"""JobStore, on both backends: rows survive reopening, pagination, final rows are immutable, recovery after a crash."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from pathlib import Path
from typing import Callable

import pytest

from vidloom.serving.job_backends import open_job_store
from vidloom.serving.job_store import STORE_ERRORS, JobRecord, Recovered, StoreError, UnknownCursor, is_job_id
from vidloom.serving.sqlite_job_store import SqliteJobStore as JobStore


@pytest.fixture(params=["sqlite", "postgresql"])
def store_at(request, tmp_path: Path) -> Callable[[Path], object]:
    """Opens the test's store (files under the given dir); a second call is the next server process."""
    url = "sqlite" if request.param == "sqlite" else request.getfixturevalue("postgres").new_database()
    opened = []

    def open_at(data_dir: Path):
        opened.append(open_job_store(url, data_dir))
        return opened[-1]

    yield open_at
    for store in opened:
        try:
            store.close()
        except Exception:
            pass


def _record(n: int, status: str = "queued") -> JobRecord:
    return JobRecord(
        id=f"video_{n:032x}", model="m", status=status, progress=0, created_at=1000 + n, completed_at=None,
        size="48x32", seconds="0.625", prompt=f"prompt {n}", params={"seed": n, "num_frames": 5},
    )


def test_rows_survive_reopening(store_at, tmp_path: Path):
    store = store_at(tmp_path)
    store.add(_record(1))
    store.set_status(_record(1).id, "in_progress")
    store.set_progress(_record(1).id, 40)
    store.finish(_record(1).id, "completed", 2000, metadata={"elapsed_s": 1.5})
    store.close()

    again = store_at(tmp_path).get(_record(1).id)
    assert again is not None and again.status == "completed" and again.progress == 100
    assert again.completed_at == 2000 and again.metadata == {"elapsed_s": 1.5} and again.params["seed"] == 1


def test_final_rows_do_not_change(store_at, tmp_path: Path):
    store = store_at(tmp_path)
    job = _record(1)
    store.add(job)
    store.finish(job.id, "cancelled", None)
    store.set_progress(job.id, 80)  # a late event from the worker
    store.finish(job.id, "failed", 3000, error=("x", "y"))
    record = store.get(job.id)
    assert record.status == "cancelled" and record.progress == 0 and record.error_code is None
    assert record.completed_at is None  # a cancelled job never completed (OpenAI: "if finished")


def test_pages_in_both_orders(store_at, tmp_path: Path):
    store = store_at(tmp_path)
    for n in range(5):
        store.add(_record(n))
    ids = [_record(n).id for n in range(5)]
    first = store.page(None, 2, "desc")
    assert [r.id for r in first.records] == [ids[4], ids[3]] and first.has_more
    assert [r.id for r in store.page(ids[3], 10, "desc").records] == ids[2::-1]
    last = store.page(ids[1], 3, "asc")
    assert [r.id for r in last.records] == ids[2:] and not last.has_more
    with pytest.raises(UnknownCursor):
        store.page(_record(99).id, 2, "asc")


def test_a_key_owners_page_holds_its_jobs_only(store_at, tmp_path: Path):
    store = store_at(tmp_path)
    owners = ["alice", "bob", "alice", None, "alice"]
    for n, owner in enumerate(owners, 1):
        store.add(dataclasses.replace(_record(n), key_owner=owner))
    assert store.get(_record(1).id).key_owner == "alice"
    first = store.page(None, 2, "asc", "alice")
    assert [r.id for r in first.records] == [_record(1).id, _record(3).id] and first.has_more
    rest = store.page(_record(3).id, 2, "asc", "alice")
    assert [r.id for r in rest.records] == [_record(5).id] and not rest.has_more
    assert [r.id for r in store.page(None, 10, "desc", "bob").records] == [_record(2).id]
    with pytest.raises(UnknownCursor):  # another owner's job is no cursor for bob: as unknown as a missing one
        store.page(_record(1).id, 2, "asc", "bob")
    assert len(store.page(None, 10, "asc").records) == 5  # no owner given: every job (admin keys)


def test_pages_of_one_model(store_at, tmp_path: Path):
    """Servers of two models sharing a data folder each list their own jobs (#39)."""
    store = store_at(tmp_path)
    for n in range(5):
        store.add(dataclasses.replace(_record(n), model="a" if n % 2 == 0 else "b"))
    ids = [_record(n).id for n in range(5)]
    assert [r.id for r in store.page(None, 10, "asc", model="a").records] == ids[0::2]
    first = store.page(None, 1, "desc", model="b")
    assert [r.id for r in first.records] == [ids[3]] and first.has_more
    assert [r.id for r in store.page(ids[3], 10, "desc", model="b").records] == [ids[1]]
    assert not store.page(None, 10, "asc", model="c").records
    assert len(store.page(None, 10, "asc").records) == 5  # no model: every job (a fleet's ingress)


def test_recover_fails_active_jobs_and_drops_stray_files(store_at, tmp_path: Path):
    store = store_at(tmp_path)
    done, running, queued = _record(1), _record(2), _record(3)
    for job in (done, running, queued):
        store.add(job)
    store.set_status(running.id, "in_progress")
    store.finish(done.id, "completed", 2000)
    store.video_path(done.id).write_bytes(b"mp4")
    store.video_path(running.id).write_bytes(b"half")  # cannot happen with atomic writes, but must not leak
    (store.videos_dir / f".{running.id}.abc.mp4").write_bytes(b"temp")  # kill -9 during an encode
    for path in store.videos_dir.iterdir():  # older than a shared store's grace for other servers' writes
        os.utime(path, (path.stat().st_mtime - 7200,) * 2)
    store.close()

    store = store_at(tmp_path)
    assert store.recover(3000, "server_restart", "restarted") == Recovered(failed=2, requeued=0)
    for job in (running, queued):
        record = store.get(job.id)
        assert record.status == "failed" and record.error_code == "server_restart" and record.completed_at == 3000
    assert store.get(done.id).status == "completed"
    assert sorted(p.name for p in store.videos_dir.iterdir()) == [f"{done.id}.mp4"]


def test_delete_removes_row_and_files(store_at, tmp_path: Path):
    store = store_at(tmp_path)
    job = _record(1)
    store.add(job)
    store.video_path(job.id).write_bytes(b"mp4")
    store.thumbnail_path(job.id).write_bytes(b"png")
    assert store.delete(job.id) and store.get(job.id) is None
    assert list(store.videos_dir.iterdir()) == []
    assert not store.delete(job.id)


def test_ids_that_could_escape_the_data_dir_are_not_ids():
    assert is_job_id(_record(1).id)
    for text in ("../jobs.sqlite3", "video_", "video_" + "g" * 32, "video_" + "0" * 32 + "/x"):
        assert not is_job_id(text)


@pytest.mark.parametrize("lost", ["deleted", "emptied"])
def test_recover_without_a_database_moves_unknown_files_aside(tmp_path: Path, lost: str):
    store = JobStore(tmp_path)
    done = _record(1)
    store.add(done)
    store.finish(done.id, "completed", 2000)
    store.video_path(done.id).write_bytes(b"mp4")
    store.thumbnail_path(done.id).write_bytes(b"png")
    (store.videos_dir / "notes.txt").write_bytes(b"the operator's")
    store.close()
    for name in ("jobs.sqlite3", "jobs.sqlite3-wal", "jobs.sqlite3-shm"):
        (tmp_path / name).unlink(missing_ok=True)  # the database is lost; the results are not
    if lost == "emptied":
        (tmp_path / "jobs.sqlite3").write_bytes(b"")  # SQLite reads a 0-byte file as an empty database

    store = JobStore(tmp_path)
    assert store.recover(3000, "server_restart", "restarted") == Recovered(0, 0)
    assert list(store.videos_dir.iterdir()) == []
    moved = {p.name: p.read_bytes() for p in store.orphans_dir.iterdir()}
    assert moved == {f"{done.id}.mp4": b"mp4", f"{done.id}.png": b"png", "notes.txt": b"the operator's"}


@pytest.mark.parametrize("content", [b"this is not a database" * 100, b""])
def test_a_corrupt_database_is_a_store_error_naming_the_file(tmp_path: Path, content: bytes):
    (tmp_path / "jobs.sqlite3").write_bytes(content or b"SQLite format 3\x00" + b"\xff" * 200)
    with pytest.raises(StoreError, match="jobs.sqlite3.*move it aside"):
        JobStore(tmp_path)


def test_delete_puts_files_back_when_the_row_cannot_go(store_at, tmp_path: Path, monkeypatch):
    store = store_at(tmp_path)
    error = type(store).__module__.endswith("postgres_job_store") and STORE_ERRORS[-1] or sqlite3.OperationalError
    job = _record(1)
    store.add(job)
    store.video_path(job.id).write_bytes(b"mp4")

    class Full:
        def __init__(self, db):
            self.db = db

        def execute(self, sql, *args):
            if sql.startswith("DELETE"):
                raise error("database or disk is full")
            return self.db.execute(sql, *args)

    monkeypatch.setattr(store, "_db", Full(store._db))
    with pytest.raises(error):
        store.delete(job.id)
    assert store.get(job.id) is not None and store.video_path(job.id).read_bytes() == b"mp4"
    assert [p.name for p in store.videos_dir.iterdir()] == [f"{job.id}.mp4"]


def test_requeue_puts_lost_jobs_back_once_each_and_fails_them_after_max_requeues(store_at, tmp_path: Path):
    store = store_at(tmp_path)
    running, done = _record(1), _record(2)
    store.add(running)
    store.add(done)
    store.set_status(running.id, "in_progress")
    store.set_progress(running.id, 60)
    store.finish(done.id, "completed", 2000)
    store.close()  # the server dies

    second = store_at(tmp_path)
    assert second.recover(3000, "server_restart", "x", requeue=True, max_requeues=1) == Recovered(0, 1)
    again = second.get(running.id)
    assert again.status == "queued" and again.progress == 0 and second.get(done.id).status == "completed"
    # Waiting to be claimed is not lost: a second recovery leaves it alone.
    assert second.recover(3001, "server_restart", "x", requeue=True, max_requeues=1) == Recovered(0, 0)
    assert [r.id for r in second.claim_requeued()] == [running.id]
    assert second.claim_requeued() == []  # claimed once only
    second.set_status(running.id, "in_progress")
    second.close()  # it kills this server too

    third = store_at(tmp_path)
    assert third.recover(4000, "server_restart", "gave up", requeue=True, max_requeues=1) == Recovered(1, 0)
    assert third.get(running.id).status == "failed" and third.get(running.id).error_message == "gave up"


def test_the_default_is_to_fail_lost_jobs_even_requeued_ones(store_at, tmp_path: Path):
    store = store_at(tmp_path)
    store.add(_record(1))
    store.close()
    second = store_at(tmp_path)
    assert second.recover(3000, "c", "m", requeue=True, max_requeues=3) == Recovered(0, 1)
    second.close()
    third = store_at(tmp_path)
    assert third.recover(3000, "c", "m") == Recovered(1, 0)  # nobody claimed it: fail mode fails it
    assert third.get(_record(1).id).status == "failed"


def test_postgres_recovery_spares_live_servers_jobs_and_ends_dead_ones(postgres, tmp_path: Path):
    url = postgres.new_database()
    alive, dying = open_job_store(url, tmp_path), open_job_store(url, tmp_path)
    survivor = open_job_store(url, tmp_path)
    try:
        alive.add(_record(1))
        dying.add(_record(2))
        alive.set_status(_record(1).id, "in_progress")
        dying.set_status(_record(2).id, "in_progress")
        fresh = alive.videos_dir / f".{_record(1).id}.tmp.mp4"
        fresh.write_bytes(b"being written by a live server")
        assert survivor.recover(5000, "server_restart", "x") == Recovered(0, 0)
        dying._db.close()  # the connection drops as when its process is killed: its lock goes with it
        deadline = time.monotonic() + 10
        while (done := survivor.recover(5000, "server_restart", "x")) == Recovered(0, 0):
            assert time.monotonic() < deadline, "the dead store's lock was never released"
            time.sleep(0.05)  # the server ends the closed session's backend asynchronously
        assert done == Recovered(1, 0)
        assert survivor.get(_record(2).id).status == "failed"
        assert survivor.get(_record(1).id).status == "in_progress" and fresh.exists()
    finally:
        alive.close()
        survivor.close()


def test_an_unreachable_or_unknown_store_is_a_store_error(tmp_path: Path):
    with pytest.raises(StoreError, match=r"postgresql://u:\*\*\*@127.0.0.1:9/x cannot be reached"):
        open_job_store("postgresql://u:secret@127.0.0.1:9/x", tmp_path)
    with pytest.raises(StoreError, match="mysql://h/x' is not a job store"):
        open_job_store("mysql://h/x", tmp_path)


# -- streaming models: time to first chunk and the stream file --------------------------------

def test_time_to_first_chunk_is_durable_and_the_stream_file_goes_with_the_job(store_at, tmp_path: Path):
    store = store_at(tmp_path)
    job, other = _record(1), _record(2)
    store.add(job)
    store.add(other)
    assert store.get(job.id).time_to_first_chunk_s is None
    store.set_first_chunk(job.id, 0.25)
    store.finish(job.id, "completed", 2000)
    store.set_first_chunk(job.id, 9.0)  # final rows never change
    store.stream_path(job.id).write_bytes(b"fmp4")
    store.video_path(job.id).write_bytes(b"mp4")
    store.close()

    store = store_at(tmp_path)
    assert store.get(job.id).time_to_first_chunk_s == 0.25
    assert store.page(None, 10, "asc").records[0].time_to_first_chunk_s == 0.25
    assert store.get(other.id).time_to_first_chunk_s is None
    assert store.delete(job.id)
    assert list(store.videos_dir.iterdir()) == []


def test_recovery_drops_a_dead_servers_growing_stream_and_keeps_finished_ones(store_at, tmp_path: Path):
    store = store_at(tmp_path)
    done, running = _record(1), _record(2)
    store.add(done)
    store.add(running)
    store.finish(done.id, "completed", 2000)
    store.stream_path(done.id).write_bytes(b"whole")
    (store.videos_dir / f".{running.id}.growing.fmp4").write_bytes(b"half")  # the server died mid-stream
    for path in store.videos_dir.iterdir():
        os.utime(path, (path.stat().st_mtime - 7200,) * 2)
    store.close()

    store = store_at(tmp_path)
    store.recover(3000, "server_restart", "restarted")
    assert sorted(p.name for p in store.videos_dir.iterdir()) == [f"{done.id}.fmp4"]


def test_requeue_forgets_the_dead_runs_time_to_first_chunk(store_at, tmp_path: Path):
    store = store_at(tmp_path)
    job = _record(1)
    store.add(job)
    store.set_first_chunk(job.id, 1.5)
    store.close()
    store = store_at(tmp_path)
    assert store.recover(3000, "server_restart", "restarted", requeue=True, max_requeues=1).requeued == 1
    assert store.get(job.id).time_to_first_chunk_s is None


# A jobs table as the first release wrote it (no owner, requeues, cancel_requested, time_to_first_chunk_s).
FIRST_RELEASE_TABLE = """
CREATE TABLE jobs (seq {seq}, id TEXT NOT NULL UNIQUE, model TEXT NOT NULL, status TEXT NOT NULL,
    progress INTEGER NOT NULL, created_at BIGINT NOT NULL, completed_at BIGINT, size TEXT NOT NULL,
    seconds TEXT NOT NULL, prompt TEXT NOT NULL, params TEXT NOT NULL, metadata TEXT, error_code TEXT,
    error_message TEXT)
"""


def test_an_older_database_gains_the_new_columns_and_keeps_its_rows(store_at, request, tmp_path: Path):
    old_row = ("video_" + "a" * 32, "m", "completed", 100, 1, 2, "48x32", "1", "p", "{}")
    insert = ("INSERT INTO jobs (id, model, status, progress, created_at, completed_at, size, seconds, prompt, params) "
              "VALUES ({})")
    if "sqlite" in request.node.callspec.id:
        db = sqlite3.connect(tmp_path / "jobs.sqlite3")
        db.execute(FIRST_RELEASE_TABLE.format(seq="INTEGER PRIMARY KEY AUTOINCREMENT"))
        db.execute(insert.format(", ".join("?" * 10)), old_row)
        db.commit()
        db.close()
        store = store_at(tmp_path)
    else:
        import psycopg

        url = request.getfixturevalue("postgres").new_database()
        with psycopg.connect(url, autocommit=True) as db:
            db.execute(FIRST_RELEASE_TABLE.format(seq="BIGSERIAL PRIMARY KEY"))
            db.execute(insert.format(", ".join(["%s"] * 10)), old_row)
        store = open_job_store(url, tmp_path)
    try:
        assert store.get(old_row[0]).status == "completed"
        assert store.get(old_row[0]).time_to_first_chunk_s is None
        assert store.get(old_row[0]).key_owner is None  # from before keys had owners: admin keys see it
        assert store.page(None, 10, "asc", "alice").records == ()
        store.add(_record(1))
        store.set_first_chunk(_record(1).id, 0.5)
        assert store.get(_record(1).id).time_to_first_chunk_s == 0.5
    finally:
        store.close()
