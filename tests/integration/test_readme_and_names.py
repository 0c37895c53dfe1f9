"""The docs' openai example (docs/serving.md) runs as written against a real server; --served-model-name is what
clients see."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def _readme_openai_snippet() -> str:
    page = (ROOT / "docs" / "serving.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    [snippet] = [b for b in blocks if "from openai import OpenAI" in b]
    return snippet


def _run_snippet(url: str, cwd: Path) -> None:
    snippet = _readme_openai_snippet()
    assert "http://127.0.0.1:8000/v1" in snippet
    code = snippet.replace("http://127.0.0.1:8000", url)
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert (cwd / "fox.mp4").stat().st_size > 0


def test_readme_openai_example_runs_as_written(start_server, tmp_path):
    _run_snippet(start_server().url, tmp_path)


def test_readme_openai_example_runs_on_the_server_the_readme_starts(demo_cache, tmp_path):
    """The README's tour serves cosmos3-demo and then points at this example: its sizes fit that model (#39)."""
    from tests.helpers.servers import ThreadServer
    from vidloom.generator import VideoGenerator
    from vidloom.serving.config import ServeConfig

    with VideoGenerator.from_pretrained("cosmos3-demo", device="cpu", cache_dir=demo_cache) as generator:
        with ThreadServer(generator.engine, ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=2)) as server:
            _run_snippet(server.url, tmp_path)


def test_served_model_name_is_the_name_clients_see_and_send(start_server):
    server = start_server(served_model_name="my-video-model")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["my-video-model"]
        assert client.get("/v1/models/my-video-model").status_code == 200
        assert client.get("/health").json()["model"] == "my-video-model"
        body = {"prompt": "a cat", "size": "48x32", "num_frames": 1, "num_inference_steps": 1}
        created = client.post("/v1/videos", json={**body, "model": "my-video-model"})
        assert created.status_code == 200 and created.json()["model"] == "my-video-model", created.text
        assert client.post("/v1/videos", json={**body, "model": "wan2.1-demo"}).status_code == 404
