"""Opening the SQLite job store at a server's start: a full disk is named as such, a database moved while a
server ran keeps every job, and its orphaned -wal stops the next start instead of hiding the jobs."""

from __future__ import annotations

import os
import sqlite3

import pytest

from vidloom.serving import job_store
from vidloom.serving.config import ServeConfig
from vidloom.serving.job_store import JobRecord, StoreError
from vidloom.serving.jobs import open_store
from vidloom.serving.sqlite_job_store import SqliteJobStore, _open_error


def _record(n: int) -> JobRecord:
    return JobRecord(
        id=f"video_{n:032x}", model="m", status="queued", progress=0, created_at=1000 + n, completed_at=None,
        size="48x32", seconds="0.625", prompt=f"prompt {n}", params={"seed": n},
    )


def _sqlite_error(message: str, code: int) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(message)
    error.sqlite_errorcode = code  # what sqlite3 sets on the errors SQLite itself raises
    return error


SHMSIZE = sqlite3.SQLITE_IOERR | (19 << 8)  # SQLITE_IOERR_SHMSIZE: what a full disk gave at open (tmpfs, 3.40)


@pytest.mark.parametrize("error, full, expected", [
    (_sqlite_error("disk I/O error", SHMSIZE), True, "the disk is full (0 KiB free in"),
    (_sqlite_error("database or disk is full", sqlite3.SQLITE_FULL), False, "the disk is full (database or disk"),
    (_sqlite_error("disk I/O error", SHMSIZE), False, "cannot be opened (disk I/O error); check the disk"),
    (_sqlite_error("file is not a database", sqlite3.SQLITE_NOTADB), True, "move it aside"),
    (sqlite3.DatabaseError("*** in database main *** Page 3 is never used"), False, "move it aside"),
])
def test_only_a_damaged_database_is_to_be_moved_aside(tmp_path, monkeypatch, error, full, expected):
    monkeypatch.setattr(job_store, "full_disk", lambda directory: "0 KiB free" if full else None)
    message = str(_open_error(tmp_path / "jobs.sqlite3", error))
    assert expected in message, message
    if "move it aside" not in expected:
        assert "do not move it aside" in message or "left as it is" in message


def test_full_disk_reads_the_file_system(tmp_path, monkeypatch):
    assert job_store.full_disk(tmp_path) is None  # the test machine has a megabyte to spare
    monkeypatch.setattr(job_store, "MIN_FREE_BYTES", 1 << 62)
    assert job_store.full_disk(tmp_path).endswith("KiB free")


def test_recovery_that_hits_a_full_disk_stops_the_start_saying_so(tmp_path, monkeypatch):
    SqliteJobStore(tmp_path).close()

    def full(*args, **kwargs):  # the first write of a restart: failing the dead server's jobs
        raise _sqlite_error("database or disk is full", sqlite3.SQLITE_FULL)

    monkeypatch.setattr(SqliteJobStore, "recover", full)
    with pytest.raises(StoreError, match=r"job store in .*: the disk is full .*do not move it aside"):
        open_store(ServeConfig(data_dir=tmp_path))


def test_a_database_moved_while_open_keeps_every_job_and_its_wal_stops_the_restart(tmp_path):
    store = SqliteJobStore(tmp_path)
    for n in range(3):
        store.add(_record(n))
    os.rename(tmp_path / "jobs.sqlite3", tmp_path / "moved.sqlite3")  # the operator, while the server runs
    store.add(_record(3))
    store.close()  # a clean shutdown

    moved = sqlite3.connect(tmp_path / "moved.sqlite3")
    assert moved.execute("SELECT COUNT(*) FROM jobs").fetchone() == (4,)  # the file that moved is whole
    moved.close()
    with pytest.raises(StoreError, match=r"jobs.sqlite3 is missing but jobs.sqlite3-wal is here.*put it back"):
        SqliteJobStore(tmp_path)
    assert not (tmp_path / "jobs.sqlite3").exists()  # nothing created: the next start still sees the -wal

    (tmp_path / "moved.sqlite3").rename(tmp_path / "jobs.sqlite3")  # the fix the message names
    again = SqliteJobStore(tmp_path)
    assert [r.id for r in again.page(None, 10, "asc").records] == [_record(n).id for n in range(4)]
    again.close()
    again.close()  # closing twice is harmless


def test_a_killed_servers_wal_without_its_database_says_how_much_it_holds(tmp_path):
    store = SqliteJobStore(tmp_path)
    store.add(_record(1))
    os.rename(tmp_path / "jobs.sqlite3", tmp_path / "moved.sqlite3")  # then kill -9: no close, no checkpoint
    with pytest.raises(StoreError, match=r"jobs.sqlite3-wal holds \d+ bytes of its latest commits"):
        SqliteJobStore(tmp_path)
    store._db.close()
