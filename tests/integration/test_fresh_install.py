"""Every `vidloom` command of the README and the Quickstart runs in the install the README's first command makes.

test_doc_examples.py runs the docs' blocks in the test install (every extra); this one copies the repository
(its tracked and unignored files: a fresh clone), runs the README's first command there verbatim (it makes
`.venv`, installs the package and writes a video), then, with that venv's `bin/` first on PATH as the tour
says, runs each `vidloom` line of the two pages' bash blocks in document order, in the copy, with a timeout:
each must exit 0 and write the files it names (`-o`, `--output`, `--audio-out`). A block under
`<!-- skip-test: ... -->` is left out here too (a server, real weights, the whole suite), except the first
command itself. Commands and the install are read from the files, so the test follows their edits.

Slow (a venv, torch from the wheel on disk through pip's cache, and every demo written once): marked `slow`,
so the quick subset leaves it out and `.ci/run`'s one pytest run runs it once. Offline but for the package
registries pip is configured with.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.test_doc_examples import ROOT, blocks_of

PAGES = ("README.md", "docs/quickstart.md")
SNIPPET = re.compile(r'^--8<--\s+"([^":]+)(?::([\w-]+))?"\s*$', re.M)  # pymdownx.snippets, as mkdocs.yml uses it
OUTPUT_FLAGS = ("-o", "--output", "--audio-out")
INSTALL_TIMEOUT_S = 1200  # the venv, torch from its wheel, the first video: 681 s measured at load 10 on 2 cores
COMMAND_TIMEOUT_S = 300  # one command, its demo written first: 50-110 s each measured at load 10 on 2 cores
COPY_IGNORED = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache", "build",
                                      "dist", "site", "vidloom-data", "*.mp4")


@dataclass(frozen=True)
class Command:
    where: str  # page:line of its block
    line: str  # the shell line, run by bash in the repository copy

    @property
    def outputs(self) -> list[str]:
        """The files the command says it writes."""
        words = shlex.split(self.line, comments=True)
        return [words[i + 1] for i, word in enumerate(words[:-1]) if word in OUTPUT_FLAGS]


def expand_snippets(path: Path) -> str:
    """The page's text with its `--8<-- "FILE:SECTION"` includes replaced by what the site shows there."""
    def include(match: re.Match) -> str:
        text = (ROOT / match.group(1)).read_text()
        if match.group(2) is None:
            return text
        start, end = f"--8<-- [start:{match.group(2)}]", f"--8<-- [end:{match.group(2)}]"
        return text.split(start, 1)[1].split(end, 1)[0].split("\n", 1)[1].rsplit("\n", 1)[0]
    return SNIPPET.sub(include, path.read_text())


def page_blocks(page: str):
    """The bash blocks of `page`, snippets included."""
    return [b for b in blocks_of(ROOT / page, expand_snippets(ROOT / page)) if b.language == "bash"]


def logical_lines(code: str) -> list[tuple[int, str]]:
    """(offset, line) of each shell line, `\\`-continued lines joined."""
    lines, start, current = [], 0, ""
    for number, raw in enumerate(code.splitlines()):
        if not current:
            start = number
        current += raw[:-1] + " " if raw.endswith("\\") else raw
        if not raw.endswith("\\"):
            lines.append((start, current))
            current = ""
    return lines


def first_command() -> Command:
    """The README's first shell command: the install every later command runs in."""
    block = page_blocks("README.md")[0]
    return Command(f"README.md:{block.line}", logical_lines(block.code)[0][1])


def doc_commands() -> list[Command]:
    """Every `vidloom` line of the pages' runnable bash blocks, in order, each once."""
    seen: dict[str, Command] = {}
    for page in PAGES:
        for block in page_blocks(page):
            if block.skip is not None:
                continue
            for offset, line in logical_lines(block.code):
                runs_vidloom = any(part.split()[:1] == ["vidloom"] for part in re.split(r"\|\||&&|[|;]", line))
                if runs_vidloom and line not in seen:
                    seen[line] = Command(f"{page}:{block.line + 1 + offset}", line)
    return list(seen.values())


def test_commands_are_read_from_the_pages():
    """The reader finds the install, the tour's commands and what each writes (no venv: quick)."""
    install = first_command()
    assert "python3 -m venv .venv" in install.line and "pip install" in install.line, install
    commands = doc_commands()
    lines = [c.line for c in commands]
    assert any(line.startswith("vidloom models") for line in lines), lines
    assert any("| vidloom chat" in line for line in lines), lines  # a piped one counts
    assert not any("vidloom serve" in line for line in lines), "a skip-test block's server ran"
    assert len(lines) == len(set(lines)), "the Quickstart's copy of the tour ran twice"
    by_output = {out: c for c in commands for out in c.outputs}
    assert {"cat.mp4", "winter.mp4", "waves.mp4", "waves.wav", "fox.png"} <= set(by_output), by_output
    assert install.outputs == ["demo.mp4"]


def fresh_env(venv_bin: Path, cache: Path) -> dict[str, str]:
    """This process's environment without its own Python (no PYTHONPATH, no active venv), the new venv first."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}", "VIDLOOM_CACHE": str(cache),
            "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # one thread: OpenMP spinning on a loaded box


def copy_checkout(target: Path) -> None:
    """The repository's tracked and unignored files (a fresh clone of this tree), else the tree less build output."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True)
    if listed.returncode != 0:
        shutil.copytree(ROOT, target, ignore=COPY_IGNORED)
        return
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def run(command: Command, cwd: Path, env: dict[str, str], timeout: int) -> str | None:
    """None when the command exits 0 and writes its files; else what went wrong."""
    started = time.monotonic()
    try:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command.line], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{command.where}: `{command.line}` ran past {timeout} s"
    print(f"{time.monotonic() - started:6.1f} s  {command.where}  {command.line}")
    if done.returncode != 0:
        return f"{command.where}: `{command.line}` exited {done.returncode}:\n{done.stderr[-1500:]}"
    missing = [out for out in command.outputs if not (cwd / out).is_file() or not (cwd / out).stat().st_size]
    return f"{command.where}: `{command.line}` wrote no {missing}" if missing else None


@pytest.mark.slow
def test_every_command_runs_in_the_readme_install(tmp_path):
    checkout, cache = tmp_path / "vidloom", tmp_path / "cache"
    copy_checkout(checkout)
    env = fresh_env(checkout / ".venv" / "bin", cache)
    install = first_command()
    failed = run(install, checkout, env, INSTALL_TIMEOUT_S)
    assert failed is None, failed
    failures = [f for f in (run(c, checkout, env, COMMAND_TIMEOUT_S) for c in doc_commands()) if f]
    assert not failures, "\n\n".join(failures)
