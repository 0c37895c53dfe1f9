"""The docs site builds with `mkdocs build --strict` (as .ci/run does): a broken link, a missing nav page or a
README section the site includes (pymdownx.snippets) that went away fails here, in the ordinary test run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    quickstart = (tmp_path / "site" / "quickstart" / "index.html").read_text()
    assert "ltx2-demo" in quickstart and "flux2-klein-demo" in quickstart  # the README's tour, included
    assert "kv_pool_tokens" in (tmp_path / "site" / "acceleration" / "index.html").read_text()  # capability table
