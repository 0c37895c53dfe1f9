"""`vidloom ARGS` in this process, reported as `subprocess.run` reports a process (exit status, stdout, stderr).

For tests whose point is what a command prints, writes and exits with: each spares a fresh interpreter and
its torch import (seconds on a loaded 2-core CI machine). Tests whose point is the process itself (Ctrl-C,
lazy imports, interpreter teardown, wall time from process start, environment read at import) keep a
subprocess.
"""

from __future__ import annotations

import io
import os
import sys
import warnings
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str


def run_cli(args: list[str], cache: Path | None = None, stdin: str = "", **env: str) -> CliRun:
    """`vidloom ARGS` with VIDLOOM_CACHE=`cache` and `env` set, `stdin` piped in; the environment and the
    warning printer are restored after. argparse's exits (usage errors, --version, --help) are statuses, as
    from a process."""
    from vidloom.cli import main

    saved_env, saved_stdin, saved_showwarning = dict(os.environ), sys.stdin, warnings.showwarning
    os.environ.update({**({"VIDLOOM_CACHE": str(cache)} if cache is not None else {}), **env})
    out, err = io.StringIO(), io.StringIO()
    sys.stdin = io.StringIO(stdin)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
    finally:
        sys.stdin, warnings.showwarning = saved_stdin, saved_showwarning  # the CLI prints warnings its way
        os.environ.clear()
        os.environ.update(saved_env)
    return CliRun(code, out.getvalue(), err.getvalue())
