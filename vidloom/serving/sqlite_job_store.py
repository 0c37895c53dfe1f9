"""The embedded job store: `<data_dir>/jobs.sqlite3` in WAL mode, one server process per data dir, with the
checks that keep a moved, damaged or unreadable database from being silently replaced by an empty one."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from vidloom.serving.job_store import StoreError, full_disk_error
from vidloom.serving.sql_job_store import LATER_COLUMNS, OWNER_INDEX_SQL, SERVERS_SQL, SqlJobStore, table_sql

log = logging.getLogger(__name__)


class SqliteJobStore(SqlJobStore):
    """`<data_dir>/jobs.sqlite3`: embedded, one server process per data dir."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, None)
        self._make_dirs()
        path = self.data_dir / "jobs.sqlite3"
        _check_not_orphaned_wal(path)
        self._db = _open_sqlite(path)

    def close(self) -> None:
        """Checkpoint everything into the database file, then close. SQLite's own close skips its checkpoint
        when the file was renamed or moved while open, leaving the latest commits in a -wal under the old
        name that no restart reads; an explicit checkpoint writes them through the open file, wherever it
        now is, so a database moved aside while the server ran is whole once the server stops."""
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.ProgrammingError:  # closed already
                return
            except sqlite3.Error as exc:  # e.g. a full disk: the -wal keeps the commits; the next start reads it
                log.warning("job database checkpoint at shutdown failed (%s); %s-wal keeps the latest commits",
                            exc, self.data_dir / "jobs.sqlite3")
            self._db.close()


def _check_not_orphaned_wal(path: Path) -> None:
    """Refuse a -wal file without its database: the database was moved or deleted while a server had it
    open. Starting anyway would create an empty database, list no jobs and move every result to orphans/."""
    wal, shm = path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")
    if path.exists() or not wal.exists():
        return
    size = wal.stat().st_size
    held = f" ({wal.name} holds {size} bytes of its latest commits)" if size else ""
    raise StoreError(f"job database {path} is missing but {wal.name} is here: the database was moved or deleted "
                     f"while a server had it open{held}. To keep its jobs put it back as {path.name}; to start "
                     f"with an empty database move {wal.name} and {shm.name} aside as well")


def _open_sqlite(path: Path) -> sqlite3.Connection:
    """Connect, check the file is a healthy SQLite database, set WAL mode and the schema."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        check = db.execute("PRAGMA quick_check(1)").fetchone()
        if check is None or check[0] != "ok":
            raise sqlite3.DatabaseError(check[0] if check else "integrity check failed")
        # WAL + NORMAL: a commit survives kill -9 of this process (only an OS crash can lose the last ones).
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(table_sql("INTEGER PRIMARY KEY AUTOINCREMENT"))
        db.execute(SERVERS_SQL)
        have = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
        for name, sql_type in LATER_COLUMNS:
            if name not in have:  # a data dir from an older vidloom
                db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {sql_type}")
        db.execute(OWNER_INDEX_SQL)
    except sqlite3.DatabaseError as exc:
        db.close()
        raise _open_error(path, exc) from None
    return db


_DAMAGED = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _open_error(path: Path, exc: sqlite3.DatabaseError) -> StoreError:
    """Why the database would not open. Only a damaged file (or one that is not SQLite) is the database's
    fault; a full disk, a disk fault or a permission leaves a good database behind, and the message must
    not tell the operator to move it aside."""
    code = getattr(exc, "sqlite_errorcode", None)  # None: our own quick_check verdict
    damaged = code is None or code & 0xFF in _DAMAGED
    full = None if damaged else full_disk_error(f"job database {path}", path.parent, exc)
    if full is not None:
        return full
    if damaged:
        return StoreError(f"job database {path} cannot be used ({exc}); move it aside to start with an empty one, "
                          "or restore it from a backup")
    return StoreError(f"job database {path} cannot be opened ({exc}); check the disk and the permissions of "
                      f"{path.parent} (the database was left as it is)")
