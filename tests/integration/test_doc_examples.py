"""Every example in the README and docs/*.md runs: a broken example fails here, not in a reader's terminal.

Each page's fenced ```python and ```bash blocks run in document order, in one fresh process per page with its
own temp dir as the working directory (so a later block may read a file an earlier one wrote, and the python
blocks of a page share one namespace, like a notebook), against the demo models (one vidloom cache for the
session, HF_HUB_OFFLINE=1: nothing is downloaded). A block preceded by a line `<!-- skip-test: <reason> -->` is
not run: one that needs real weights, a GPU, a running server or minutes. Its reason must say which.

A bash block of plain `vidloom ...` lines (no pipe, redirect or expansion) runs them in the page's process
(`vidloom.cli.main`), sparing a torch import each; test_fresh_install runs the installed `vidloom` script. The
README and Quickstart lines that test_fresh_install runs are left to it when it runs in the same session (CI's
one run): each is a demo's whole run, and one run of each is the check.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
SKIP = re.compile(r"^<!--\s*skip-test:(.*?)-->\s*$")
RUN_LANGUAGES = ("python", "bash")
SHELL_SYNTAX = re.compile(r"[|&;<>$`*?~(){}\[\]!#]")  # a line with any of these runs through bash
FRESH_INSTALL_TEST = "test_fresh_install.py::test_every_command_runs_in_the_readme_install"
PAGE_TIMEOUT_S = 1200  # the README's tour, one command per demo: ~150 CPU-seconds, over 10 minutes of wall time at load 10


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    skip: str | None  # the reason given, None when the block runs


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(path: Path, text: str | None = None) -> list[Block]:
    """The fenced python and bash blocks of one page (`text`: its text, when not the file's), each with the skip
    reason of the line before it."""
    text = path.read_text() if text is None else text
    found = []
    for match in FENCE.finditer(text):
        language = match.group(1)
        if language not in RUN_LANGUAGES:
            continue
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.match(before.strip())
        found.append(Block(str(path.relative_to(ROOT)), text.count("\n", 0, match.start()) + 1, language,
                           match.group(2), skip.group(1).strip() if skip else None))
    return found


def shell_lines(code: str) -> list[str]:
    """The block's shell lines, `\\`-continued ones joined (as test_fresh_install reads them)."""
    from tests.integration.test_fresh_install import logical_lines

    return [line for _, line in logical_lines(code) if line.strip()]


def vidloom_argv(line: str) -> list[str] | None:
    """The arguments of a plain `vidloom ARGS` line; None for any other line (bash runs those)."""
    parts = re.split(r"""("[^"]*"|'[^']*')""", line)  # even: unquoted; odd: quoted
    double_quoted = "".join(part for part in parts[1::2] if part.startswith('"'))
    if SHELL_SYNTAX.search("".join(parts[0::2])) or re.search(r"[$`\\]", double_quoted):
        return None
    words = shlex.split(line)
    return words[1:] if words[:1] == ["vidloom"] else None


def runnable_blocks(page: Path, left_out: frozenset[str] = frozenset()) -> list[dict]:
    """The page's blocks to run, as the driver reads them: the lines in `left_out` dropped from bash blocks (a
    block left with none dropped too), and a bash block of plain `vidloom` lines given as their argvs."""
    runnable = []
    for block in (b for b in blocks_of(page) if b.skip is None):
        argvs = None
        if block.language == "bash":
            lines = shell_lines(block.code)
            kept = [line for line in lines if line not in left_out]
            if not kept:
                continue
            if kept != lines:
                block = replace(block, code="\n".join(kept) + "\n")
            argvs = [vidloom_argv(line) for line in kept]
            argvs = None if None in argvs else argvs
        runnable.append({**asdict(block), "argvs": argvs})
    return runnable


# Runs in the page's process: every block in order, python ones in one namespace, plain `vidloom` ones through
# the CLI's main, other bash ones with errexit.
DRIVER = r"""
import json, subprocess, sys, time, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for block in blocks:
    where = f"{block['page']}:{block['line']}"
    print(f"--- running {block['language']} block at {where} ({time.process_time():.1f} CPU-s so far)", flush=True)
    if block["language"] == "python":
        try:
            exec(compile(block["code"], where, "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            sys.exit(f"the python block at {where} failed")
    elif block["argvs"] is not None:
        from vidloom.cli import main
        for argv in block["argvs"]:
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
            if code != 0:
                sys.exit(f"`vidloom {' '.join(argv)}` of the bash block at {where} exited with {code}")
    else:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block["code"]])
        if done.returncode != 0:
            sys.exit(f"the bash block at {where} exited with {done.returncode}")
"""


@pytest.fixture(scope="session")
def left_to_fresh_install(request) -> frozenset[str]:
    """The README and Quickstart shell lines test_fresh_install runs, when it is in this session's run: CI runs
    each once, there. Run alone, this file runs them too."""
    from tests.integration.test_fresh_install import doc_commands

    if not any(item.nodeid.endswith(FRESH_INSTALL_TEST) for item in request.session.items):
        return frozenset()
    return frozenset(command.line for command in doc_commands())


def test_the_lines_left_to_fresh_install_are_the_ones_it_runs():
    """Leaving test_fresh_install's lines out drops exactly them, line for line: both files read the same
    lines, so none falls between the two and none runs in both."""
    from tests.integration.test_fresh_install import doc_commands

    runs = frozenset(command.line for command in doc_commands())
    def bash_lines(blocks: list[dict]) -> set[str]:
        return {line for b in blocks if b["language"] == "bash" for line in shell_lines(b["code"])}

    left_out = set()
    for page in doc_pages():
        left_out |= bash_lines(runnable_blocks(page)) - bash_lines(runnable_blocks(page, runs))
    assert left_out == runs, (sorted(runs - left_out), sorted(left_out - runs))
    assert any(line.startswith("vidloom generate --model ltx2-demo") for line in left_out)
    readme = runnable_blocks(ROOT / "README.md", runs)
    assert [b["language"] for b in readme] == ["python"], readme  # the README's shell lines all run there


def test_plain_vidloom_lines_run_in_process_and_the_rest_through_bash():
    assert vidloom_argv("""vidloom generate --model hunyuan15-demo --prompt 'a sign that says "open"' -o s.mp4""") \
        == ["generate", "--model", "hunyuan15-demo", "--prompt", 'a sign that says "open"', "-o", "s.mp4"]
    assert vidloom_argv("vidloom models") == ["models"]
    for line in ('echo "hi" | vidloom chat --model cosmos3-demo', "vidloom generate --shift 3 || echo refused",
                 "vidloom generate -o $OUT", "vidloom models > models.txt", "python -c 'print(1)'"):
        assert vidloom_argv(line) is None, line


def _runnable_pages() -> list[Path]:
    return [page for page in doc_pages() if any(b.skip is None for b in blocks_of(page))]


def test_skipped_blocks_say_why():
    unexplained = [f"{b.page}:{b.line}" for page in doc_pages() for b in blocks_of(page) if b.skip == ""]
    assert not unexplained, f"`<!-- skip-test: -->` without a reason at {unexplained}"


def test_the_readme_tour_runs_here():
    """The README's tour is executed (not skipped) for every demo family, and more than the README runs."""
    from vidloom import registry

    readme = [b for b in blocks_of(ROOT / "README.md") if b.skip is None]
    text = (ROOT / "README.md").read_text()
    tour = text[text.index("[start:tour]"):text.index("[end:tour]")]  # what the Quickstart shows too
    demos = [c.model_id for c in registry.list_cards() if c.model_id.endswith("-demo")]
    assert len(demos) == 16 and registry.DEFAULT_MODEL in demos
    for demo in [d for d in demos if d != registry.DEFAULT_MODEL] + ["--video cat.mp4"]:  # every demo (#39)
        assert any(demo in b.code for b in readme), f"the README's tour runs nothing with {demo}"
        assert demo in tour, f"the tour (README and Quickstart) shows no command for {demo}"
    assert any(b.code.startswith("vidloom generate --prompt") for b in readme)  # the default, wan2.1-demo
    assert len(_runnable_pages()) >= 3


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """One vidloom cache for every page, so each demo checkpoint is written once."""
    return tmp_path_factory.mktemp("doc-examples-cache")


@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page, shared_cache, left_to_fresh_install, tmp_path):
    blocks = runnable_blocks(page, left_to_fresh_install)
    (tmp_path / ".blocks.json").write_text(json.dumps(blocks))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VIDLOOM_CACHE": str(shared_cache), "HF_HUB_OFFLINE": "1",
           # one thread per process: on a loaded machine OpenMP's spin-waiting multiplies the wall time
           "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path / ".blocks.json")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=PAGE_TIMEOUT_S)
    assert done.returncode == 0, f"{done.stderr[-4000:]}\n{done.stdout[-2000:]}"
    assert done.stdout.count("--- running") == len(blocks), done.stdout[-2000:]
