"""The job table in SQL, shared by both backends (the embedded SQLite one is sqlite_job_store.py).

The statements are written once with `?` placeholders; a backend's `_PARAM` rewrites them (psycopg
takes `%s`). Both connections run in autocommit, so each statement is its own transaction.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Literal, Mapping

from vidloom.media.atomic import atomic_path
from vidloom.serving.job_store import (
    FINAL, JobRecord, Page, Recovered, StoreError, UnknownCursor, is_image_file, is_job_id,
)

log = logging.getLogger(__name__)
_ACTIVE_SQL = "('queued', 'in_progress')"
COLUMNS = (
    "id, model, status, progress, created_at, completed_at, size, seconds, prompt, params, metadata, "
    "error_code, error_message, time_to_first_chunk_s, key_owner"
)
# Columns after the first release: (name, SQL type), added to older tables when they are opened.
LATER_COLUMNS = (("owner", "BIGINT"), ("requeues", "INTEGER NOT NULL DEFAULT 0"),
                 ("cancel_requested", "INTEGER NOT NULL DEFAULT 0"), ("time_to_first_chunk_s", "DOUBLE PRECISION"),
                 ("key_owner", "TEXT"))  # rows from before keys had owners: NULL, seen by admin keys only
# One key owner's page of jobs (GET /v1/videos with a user key) without reading everyone's.
OWNER_INDEX_SQL = "CREATE INDEX IF NOT EXISTS jobs_key_owner ON jobs (key_owner, seq)"
# Servers sharing the table publish who they are and their metrics here (a fleet's /metrics reads it).
SERVERS_SQL = """
CREATE TABLE IF NOT EXISTS servers (
    owner BIGINT PRIMARY KEY,
    name TEXT NOT NULL,
    model TEXT NOT NULL,
    metrics TEXT NOT NULL,
    updated_at BIGINT NOT NULL
)
"""


def table_sql(seq_column: str) -> str:
    return f"""
CREATE TABLE IF NOT EXISTS jobs (
    seq {seq_column},
    id TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    status TEXT NOT NULL,
    progress INTEGER NOT NULL,
    created_at BIGINT NOT NULL,
    completed_at BIGINT,
    size TEXT NOT NULL,
    seconds TEXT NOT NULL,
    prompt TEXT NOT NULL,
    params TEXT NOT NULL,
    metadata TEXT,
    error_code TEXT,
    error_message TEXT,
    owner BIGINT,
    requeues INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    time_to_first_chunk_s DOUBLE PRECISION,
    key_owner TEXT
)
"""


class SqlJobStore:
    """The JobStore contract over a DB-API-like connection `_db` (`execute(sql, args)` -> cursor)."""

    _PARAM = "?"
    shared = False  # True: other live servers use the same table (recovery then runs periodically)
    # Leftover temp files younger than this may belong to another live server (shared data dir).
    temp_file_grace_s = 0.0

    def __init__(self, data_dir: Path, db: Any) -> None:
        self.data_dir = Path(data_dir)
        self.videos_dir = self.data_dir / "videos"
        self.orphans_dir = self.data_dir / "orphans"
        self.owner = 1 + secrets.randbelow(2**31 - 2)  # fits PostgreSQL's advisory lock key (int4)
        self._lock = threading.Lock()
        self._db = db

    def _make_dirs(self) -> None:
        try:
            self.videos_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"data dir {self.data_dir}: cannot create {self.videos_dir} ({exc.strerror})") from None

    def _run(self, sql: str, args: tuple = ()) -> Any:
        """Execute one statement (call with the lock held)."""
        return self._db.execute(sql.replace("?", self._PARAM) if self._PARAM != "?" else sql, args)

    def _job_file(self, job_id: str, suffix: str) -> Path:
        assert is_job_id(job_id), job_id
        return self.videos_dir / f"{job_id}{suffix}"

    def video_path(self, job_id: str) -> Path:
        return self._job_file(job_id, ".mp4")

    def image_path(self, name: str, owner: str | None = None) -> Path:
        """Where an images call with response_format=url keeps its file (served under /v1/images/files): in a
        folder of its key's owner (api_keys.py: an owner is a safe folder name); at the top without keys."""
        assert is_image_file(name), name
        return self.data_dir / "images" / (owner or "") / name

    def image_paths(self, name: str) -> list[Path]:
        """Every owner's file called `name` (an admin's lookup; names are random, so at most one)."""
        assert is_image_file(name), name
        images = self.data_dir / "images"
        return [path for path in (images / name, *images.glob(f"*/{name}")) if path.is_file()]

    def save_image(self, name: str, data: bytes, owner: str | None = None) -> None:
        path = self.image_path(name, owner)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:  # a reader never sees half a file
            tmp.write_bytes(data)

    def thumbnail_path(self, job_id: str) -> Path:
        return self._job_file(job_id, ".png")

    def stream_path(self, job_id: str) -> Path:
        return self._job_file(job_id, ".fmp4")

    def latents_path(self, job_id: str) -> Path:
        return self._job_file(job_id, ".latents")  # one suffix: tidy finds the job id as its stem

    def actions_path(self, job_id: str) -> Path:
        return self._job_file(job_id, ".npy")

    def audio_path(self, job_id: str) -> Path:
        return self._job_file(job_id, ".wav")

    def _files(self, job_id: str) -> tuple[Path, ...]:
        return (self.video_path(job_id), self.thumbnail_path(job_id), self.stream_path(job_id),
                self.latents_path(job_id), self.actions_path(job_id), self.audio_path(job_id))

    def add(self, record: JobRecord) -> None:
        with self._lock:
            self._run(
                f"INSERT INTO jobs ({COLUMNS}, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (record.id, record.model, record.status, record.progress, record.created_at, record.completed_at,
                 record.size, record.seconds, record.prompt, json.dumps(dict(record.params), default=str),
                 _dumps(record.metadata), record.error_code, record.error_message, record.time_to_first_chunk_s,
                 record.key_owner, self.owner),
            )

    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            row = self._run(f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _record(row) if row else None

    def page(self, after: str | None, limit: int, order: Literal["asc", "desc"],
             only_owner: str | None = None, model: str | None = None) -> Page:
        """Up to `limit` jobs in creation order, starting after the job `after`; only those of key owner
        `only_owner` and of `model` when given (another owner's or model's job as `after` is as unknown as a
        missing one)."""
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        mine, mine_args = ("", ()) if only_owner is None else (" AND key_owner = ?", (only_owner,))
        if model is not None:
            mine, mine_args = f"{mine} AND model = ?", (*mine_args, model)
        with self._lock:
            where, args = f"WHERE 1 = 1{mine}", mine_args
            if after is not None:
                row = self._run(f"SELECT seq FROM jobs WHERE id = ?{mine}", (after, *mine_args)).fetchone()
                if row is None:
                    raise UnknownCursor(after)
                where, args = f"{where} AND seq {op} ?", (*args, row[0])
            rows = self._run(
                f"SELECT {COLUMNS} FROM jobs {where} ORDER BY seq {direction} LIMIT ?", (*args, limit + 1)
            ).fetchall()
        return Page(tuple(_record(r) for r in rows[:limit]), has_more=len(rows) > limit)

    def set_status(self, job_id: str, status: str) -> None:
        self._update_active(job_id, "status = ?", (status,))

    def set_progress(self, job_id: str, progress: int) -> None:
        self._update_active(job_id, "progress = ?", (progress,))

    def set_first_chunk(self, job_id: str, seconds: float) -> None:
        self._update_active(job_id, "time_to_first_chunk_s = ?", (seconds,))

    def finish(self, job_id: str, status: str, completed_at: int | None, *, metadata: Mapping[str, Any] | None = None,
               error: tuple[str, str] | None = None) -> None:
        """Move an active job to a final status (no-op if it already finished or is gone)."""
        assert status in FINAL, status
        code, message = error if error else (None, None)
        progress_sql = ", progress = 100" if status == "completed" else ""
        self._update_active(
            job_id,
            f"status = ?, completed_at = ?, metadata = ?, error_code = ?, error_message = ?{progress_sql}",
            (status, completed_at, _dumps(metadata), code, message),
        )

    def delete(self, job_id: str) -> bool:
        """Remove the row and its files, both or neither; False if there was no such job.

        The files are first renamed aside (which fails, changing nothing, if the folder is read-only),
        then the row goes; if that fails they are renamed back. Raises OSError or a STORE_ERRORS error.
        """
        with self._lock:
            if self._run("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                return False
            aside = self._set_aside(job_id)
            try:
                self._run("DELETE FROM jobs WHERE id = ?", (job_id,))
            except BaseException:
                for original, moved in aside:
                    moved.replace(original)
                raise
        for _, moved in aside:
            moved.unlink(missing_ok=True)  # "." names: a crash here leaves them to the next recover()
        return True

    def _set_aside(self, job_id: str) -> list[tuple[Path, Path]]:
        done: list[tuple[Path, Path]] = []
        try:
            for path in self._files(job_id):
                if path.exists():
                    # "-": never in an atomic_path temp name (mkstemp), so the two cannot collide.
                    moved = path.with_name(f".{path.stem}-deleting{path.suffix}")
                    path.replace(moved)
                    done.append((path, moved))
        except OSError:
            for original, moved in reversed(done):
                moved.replace(original)
            raise
        return done

    def remove_files(self, job_id: str) -> None:
        for path in self._files(job_id):
            path.unlink(missing_ok=True)

    def _dead_owner_sql(self) -> tuple[str, tuple]:
        """SQL condition (and args) true for rows whose owner process is gone. Default: any owner but us."""
        return "(owner IS NULL OR owner <> ?)", (self.owner,)

    def recover(self, completed_at: int, code: str, message: str, *, requeue: bool = False,
                max_requeues: int = 0, tidy: bool = True) -> Recovered:
        """Fail (or re-queue) active jobs whose owner died, then (`tidy`) tidy the videos folder."""
        dead, dead_args = self._dead_owner_sql()
        lost = f"status IN {_ACTIVE_SQL} AND {dead}"
        with self._lock:
            requeued = 0
            if requeue:
                # Ownerless queued rows are re-queued jobs waiting to be claimed; leave them be.
                requeued = self._run(
                    "UPDATE jobs SET status = 'queued', progress = 0, owner = NULL, requeues = requeues + 1, "
                    "time_to_first_chunk_s = NULL "
                    f"WHERE {lost} AND owner IS NOT NULL AND requeues < ?", (*dead_args, max_requeues),
                ).rowcount
                lost += " AND NOT (status = 'queued' AND owner IS NULL)"
            failed = self._run(
                f"UPDATE jobs SET status = 'failed', completed_at = ?, error_code = ?, error_message = ? WHERE {lost}",
                (completed_at, code, message, *dead_args),
            ).rowcount
            status = dict(self._run("SELECT id, status FROM jobs").fetchall())
        if tidy:
            self._tidy(status)
        return Recovered(failed=failed, requeued=requeued)

    def claim_requeued(self) -> list[JobRecord]:
        with self._lock:
            rows = self._run(
                f"UPDATE jobs SET owner = ? WHERE status = 'queued' AND owner IS NULL RETURNING {COLUMNS}",
                (self.owner,),
            ).fetchall()
        return sorted((_record(r) for r in rows), key=lambda r: r.created_at)

    def request_cancel(self, job_id: str) -> None:
        """Ask the job's owner (possibly another server) to cancel it; owners poll `control()`."""
        self._update_active(job_id, "cancel_requested = 1", ())

    def control(self, live: set[str]) -> tuple[set[str], set[str]]:
        """For this server's `live` jobs: (cancel requested by another server, no longer ours or gone)."""
        with self._lock:
            rows = self._run(f"SELECT id, cancel_requested FROM jobs WHERE owner = ? AND status IN {_ACTIVE_SQL}",
                             (self.owner,)).fetchall()
        ours = {job_id: flag for job_id, flag in rows}
        return {j for j in live if ours.get(j)}, {j for j in live if j not in ours}

    def publish_server(self, name: str, model: str, metrics: str, now: int) -> None:
        with self._lock:
            self._run("DELETE FROM servers WHERE owner = ?", (self.owner,))
            self._run("INSERT INTO servers (owner, name, model, metrics, updated_at) VALUES (?, ?, ?, ?, ?)",
                      (self.owner, name, model, metrics, now))

    def live_servers(self) -> list[tuple[str, str, str]]:
        """(name, model, metrics text) of servers whose owner is alive; entries of dead ones are dropped."""
        dead, dead_args = self._dead_owner_sql()
        with self._lock:
            self._run(f"DELETE FROM servers WHERE owner <> ? AND {dead}", (self.owner, *dead_args))
            rows = self._run("SELECT name, model, metrics FROM servers ORDER BY model, name").fetchall()
        return [tuple(r) for r in rows]

    def _tidy(self, status: Mapping[str, str]) -> None:
        """Drop stray temp files and results of failed jobs; move files no row accounts for to orphans/."""
        orphans = 0
        for path in self.videos_dir.iterdir():
            if not path.is_file():
                continue
            if time.time() - path.stat().st_mtime < self.temp_file_grace_s:
                continue  # maybe another live server's write, newer than our snapshot of the table
            if path.name.startswith("."):  # our temp files (atomic_path) and files set aside by delete
                path.unlink(missing_ok=True)
            elif path.stem not in status:  # no row: results of a lost or replaced database; keep them
                self.orphans_dir.mkdir(exist_ok=True)
                path.replace(self.orphans_dir / path.name)
                orphans += 1
            elif status[path.stem] in ("failed", "cancelled"):  # a job that ended mid-write
                path.unlink(missing_ok=True)
        if orphans:
            log.warning("moved %d file(s) no job accounts for to %s (nothing was deleted)", orphans, self.orphans_dir)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _update_active(self, job_id: str, assignments: str, args: tuple) -> None:
        with self._lock:
            self._run(f"UPDATE jobs SET {assignments} WHERE id = ? AND status IN {_ACTIVE_SQL}", (*args, job_id))


def _dumps(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(dict(value), default=str)  # str: e.g. numpy scalars


def _record(row: tuple) -> JobRecord:
    (job_id, model, status, progress, created_at, completed_at, size, seconds, prompt, params, metadata,
     error_code, error_message, first_chunk_s, key_owner) = row
    return JobRecord(
        id=job_id, model=model, status=status, progress=progress, created_at=created_at,
        completed_at=completed_at, size=size, seconds=seconds, prompt=prompt, params=json.loads(params),
        metadata=json.loads(metadata) if metadata else None, error_code=error_code, error_message=error_message,
        time_to_first_chunk_s=first_chunk_s, key_owner=key_owner,
    )
