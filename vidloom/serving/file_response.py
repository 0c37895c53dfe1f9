"""A FileResponse that serves a file the route has already opened, so a concurrent unlink cannot break it."""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, BinaryIO

import anyio
from starlette.responses import FileResponse
from starlette.types import Receive, Scope, Send


class OpenFileResponse(FileResponse):
    """Starlette's FileResponse (HEAD, Range, ETag) reading from `file` instead of reopening `path`.

    On POSIX an open file stays readable after it is unlinked or renamed, which is what makes
    DELETE racing a download safe. `path` only names the download; the response closes `file`.
    """

    def __init__(self, file: BinaryIO, path: Path, **kwargs: Any) -> None:
        super().__init__(path, stat_result=os.fstat(file.fileno()), **kwargs)
        self._file = file

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # pathsend would hand the server the path to reopen: exactly the race this class avoids.
        extensions = {k: v for k, v in scope.get("extensions", {}).items() if k != "http.response.pathsend"}
        try:
            await super().__call__({**scope, "extensions": extensions}, receive, send)
        finally:
            self._file.close()

    @asynccontextmanager
    async def _open_file(self) -> AsyncIterator[anyio.AsyncFile[bytes]]:
        # Overrides FileResponse's opener (starlette 1.x); tests/integration/test_server_faults.py checks a
        # download of an unlinked file still succeeds, so a starlette change here cannot go unnoticed.
        yield anyio.wrap_file(self._file)
