"""The job table in PostgreSQL (psycopg 3): one database shared by several servers, files on a shared dir.

Liveness without heartbeats: each store holds a session advisory lock keyed by its `owner` id for as
long as its connection lives. A process that dies (kill -9 included) drops its connection, the
server releases the lock, and from then on recovery sees its jobs as lost. A live server's jobs are
never touched, however long they run.
"""

from __future__ import annotations

from pathlib import Path

from vidloom.serving.job_store import StoreError, redact_url
from vidloom.serving.sql_job_store import LATER_COLUMNS, OWNER_INDEX_SQL, SERVERS_SQL, SqlJobStore, table_sql

LOCK_SPACE = 0x766C  # first key of vidloom's advisory locks ("vl"); the second is the owner id
CONNECT_TIMEOUT_S = 10


class PostgresJobStore(SqlJobStore):
    """PostgreSQL at `url`; result files under `data_dir` (a directory every server mounts)."""

    _PARAM = "%s"
    shared = True
    temp_file_grace_s = 3600.0  # another live server may be writing a result right now

    def __init__(self, url: str, data_dir: Path) -> None:
        super().__init__(data_dir, None)
        self._make_dirs()
        self.url = url
        self._db = _connect(url)
        try:
            self._db.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_SPACE, self.owner))
            self._db.execute("SELECT pg_advisory_lock(%s, 0)", (LOCK_SPACE,))  # one schema change at a time
            try:
                self._db.execute(table_sql("BIGSERIAL PRIMARY KEY"))
                for name, sql_type in LATER_COLUMNS:
                    self._db.execute(f"ALTER TABLE jobs ADD COLUMN IF NOT EXISTS {name} {sql_type}")
                self._db.execute(SERVERS_SQL)
                self._db.execute(OWNER_INDEX_SQL)
                self._db.execute("CREATE INDEX IF NOT EXISTS jobs_active ON jobs (status) "
                                 "WHERE status IN ('queued', 'in_progress')")
            finally:
                self._db.execute("SELECT pg_advisory_unlock(%s, 0)", (LOCK_SPACE,))
        except Exception as exc:
            self._db.close()
            raise StoreError(f"job database {redact_url(url)} cannot be used ({exc})") from None

    def _dead_owner_sql(self) -> tuple[str, tuple]:
        # A session lock taken with two int4 keys shows in pg_locks as (classid, objid, objsubid = 2).
        return (
            "(owner IS NULL OR owner NOT IN (SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' "
            "AND classid = %s AND objsubid = 2 AND granted))",
            (LOCK_SPACE,),
        )


def _connect(url: str):  # -> psycopg.Connection
    try:
        import psycopg
    except ImportError:
        raise StoreError("store: PostgreSQL needs psycopg; pip install 'psycopg[binary]'") from None
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        raise StoreError(f"job database {redact_url(url)} cannot be reached ({str(exc).strip()})") from None
