"""Every example in the README and docs/*.md runs: a broken example fails here, not in a reader's terminal.

Each page's fenced ```python and ```bash blocks run in document order, in one fresh process per page with its
own temp dir as the working directory (so a later block may read a file an earlier one wrote, and the python
blocks of a page share one namespace, like a notebook), against the demo models (one vidloom cache for the
session, HF_HUB_OFFLINE=1: nothing is downloaded). A block preceded by a line `<!-- skip-test: <reason> -->` is
not run: one that needs real weights, a GPU, a running server or minutes. Its reason must say which.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
SKIP = re.compile(r"^<!--\s*skip-test:(.*?)-->\s*$")
RUN_LANGUAGES = ("python", "bash")
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


# Runs in the page's process: every block in order, python ones in one namespace, bash ones with errexit.
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
    else:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block["code"]])
        if done.returncode != 0:
            sys.exit(f"the bash block at {where} exited with {done.returncode}")
"""


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
def test_page_examples_run(page, shared_cache, tmp_path):
    blocks = [asdict(b) for b in blocks_of(page) if b.skip is None]
    (tmp_path / ".blocks.json").write_text(json.dumps(blocks))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VIDLOOM_CACHE": str(shared_cache), "HF_HUB_OFFLINE": "1",
           # one thread per process: on a loaded machine OpenMP's spin-waiting multiplies the wall time
           "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path / ".blocks.json")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=PAGE_TIMEOUT_S)
    assert done.returncode == 0, f"{done.stderr[-4000:]}\n{done.stdout[-2000:]}"
    assert done.stdout.count("--- running") == len(blocks), done.stdout[-2000:]
