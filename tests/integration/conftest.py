"""Server fixtures: the demo model loaded once per session, real uvicorn servers on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from tests.helpers.servers import BLOCKING_STEPS, ThreadServer
from vidloom.runtime.engine import Engine
from vidloom.serving.config import ServeConfig


@pytest.fixture(scope="session")
def demo_engine(demo_cache: Path) -> Engine:
    """One loaded demo model shared by every in-process server (they run one after another)."""
    from vidloom.generator import VideoGenerator

    return VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache).engine


@pytest.fixture(scope="module")
def server(demo_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    """The shared server of a test module: fifo, one slot, four waiting places."""
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("serve-data"), queue_size=4, graceful_shutdown_s=2,
                         max_steps=BLOCKING_STEPS)
    with ThreadServer(demo_engine, config) as running:
        yield running


@pytest.fixture
def client(server: ThreadServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture
def start_server(demo_engine: Engine, tmp_path: Path) -> Iterator[Callable[..., ThreadServer]]:
    """Start servers with custom settings (data_dir defaults to this test's tmp dir); all stop at teardown."""
    started: list[ThreadServer] = []

    def start(**settings: object) -> ThreadServer:
        settings.setdefault("data_dir", tmp_path / "data")
        settings.setdefault("graceful_shutdown_s", 2)
        settings.setdefault("max_steps", BLOCKING_STEPS)
        started.append(ThreadServer(demo_engine, ServeConfig(**settings)))
        return started[-1]

    yield start
    for running in reversed(started):
        running.stop()
