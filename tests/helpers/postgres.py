"""A throwaway PostgreSQL server for tests: a fresh cluster in a temp dir, on a loopback port, stopped after.

Uses the Debian packages' binaries (/usr/lib/postgresql/<version>/bin). PostgreSQL refuses to run
as root, so under root the cluster belongs to the `postgres` user and the tools run through runuser.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

START_TIMEOUT_S = 60


def postgres_bin() -> Path | None:
    """The newest installed server's bin dir, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """initdb + pg_ctl start on construction; `stop()` stops it and removes the cluster."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="vidloom-pg-"))  # not under pytest's root-only tmp dirs
        self.data = self.root / "data"
        self._as = self._user_prefix()
        self._run("initdb", "-D", str(self.data), "-U", "vidloom", "-A", "trust", "--no-sync", "-E", "UTF8")
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", options,
                  "-w", "-t", str(START_TIMEOUT_S), "start")
        self._databases = 0

    def _user_prefix(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        user = pwd.getpwnam("postgres")
        os.chown(self.root, user.pw_uid, user.pw_gid)
        return ["runuser", "-u", "postgres", "--"]

    def _run(self, tool: str, *args: str) -> None:
        proc = subprocess.run([*self._as, str(self.bin / tool), *args], capture_output=True, text=True,
                              timeout=START_TIMEOUT_S + 30)
        if proc.returncode != 0:
            log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
            raise RuntimeError(f"{tool} failed ({proc.returncode}): {proc.stderr or proc.stdout}\n{log}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://vidloom@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A URL to a fresh, empty database (one per test keeps tests apart)."""
        import psycopg

        self._databases += 1
        name = f"test_{os.getpid()}_{self._databases}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
