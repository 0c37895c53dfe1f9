"""The job store a URL names: SQLite in the data dir (the default) or a PostgreSQL database."""

from __future__ import annotations

from pathlib import Path

from vidloom.serving.job_store import JobStore, StoreError, redact_url
from vidloom.serving.postgres_job_store import PostgresJobStore
from vidloom.serving.sqlite_job_store import SqliteJobStore


def open_job_store(url: str | None, data_dir: Path) -> JobStore:
    """`url` None or "sqlite": `<data_dir>/jobs.sqlite3`; "postgresql://...": that database (files still in data_dir)."""
    if url is None or url == "sqlite":
        return SqliteJobStore(data_dir)
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresJobStore(url, data_dir)
    raise StoreError(f"store: {redact_url(url)!r} is not a job store; use sqlite (the default) or postgresql://...")
