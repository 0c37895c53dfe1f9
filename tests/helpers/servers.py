"""Real vidloom servers for tests and benchmarks: uvicorn on 127.0.0.1 in a thread or a subprocess."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from vidloom.runtime.engine import Engine
from vidloom.serving.app import create_app
from vidloom.serving.config import ServeConfig
from vidloom.serving.server import bind, uvicorn_server

# A small job for the demo model: ~0.1 s of compute on a laptop CPU.
SMALL = {"size": "48x32", "num_frames": 5, "num_inference_steps": 2, "seed": 7}
# BlockingJob's step count: above the demo card's default max_steps, so test servers raise that limit.
BLOCKING_STEPS = 2000


def wait_healthy(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not become healthy in {timeout}s")


class ThreadServer:
    """The app over an already-loaded engine, served by uvicorn in a background thread."""

    def __init__(self, engine: Engine, config: ServeConfig) -> None:
        self.config = config
        sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        # config.health_port set: a probe-only listener on a free port, at health_url
        health = None if config.health_port is None else bind("127.0.0.1", 0)
        self.health_url = None if health is None else f"http://127.0.0.1:{health.getsockname()[1]}"
        self.app = create_app(engine, config)  # tests reach the job manager as app.state.jobs
        self._server = uvicorn_server(self.app, config, log_level="warning", health_sock=health)
        sockets = [sock] if health is None else [sock, health]
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": sockets}, daemon=True)
        self._thread.start()
        wait_healthy(self.url)

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "server thread did not stop"

    def __enter__(self) -> "ThreadServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ProcessServer:
    """`python -m vidloom.cli serve --port 0` in a subprocess; output goes to a log file, not a pipe."""

    def __init__(self, data_dir: Path, cache_dir: Path, log_path: Path, *extra: str) -> None:
        env = {**os.environ, "VIDLOOM_CACHE": str(cache_dir)}
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vidloom.cli", "serve", "--port", "0", "--data-dir", str(data_dir),
             "--max-steps", str(BLOCKING_STEPS), *extra],
            stdout=self._log, stderr=subprocess.STDOUT, env=env,
        )
        self.url = self._wait_for_url()
        wait_healthy(self.url)

    def _wait_for_url(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(r"on (http://127\.0\.0\.1:\d+)", self.log_path.read_text())
            if match:
                return match.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log_path.read_text()}")
            time.sleep(0.05)
        raise TimeoutError(f"server did not print its address:\n{self.log_path.read_text()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()

    def terminate(self) -> int:
        """SIGTERM: uvicorn shuts down cleanly, then re-raises the signal (exit status -15)."""
        self.proc.terminate()
        code = self.proc.wait(60)
        self._log.close()
        return code


# -- client-side helpers ------------------------------------------------------------------

def create_video(client: httpx.Client, **fields: object) -> dict:
    body = {"prompt": "a cat walks on the beach", **SMALL, **fields}
    response = client.post("/v1/videos", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def wait_for_status(client: httpx.Client, video_id: str, statuses: set[str], timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        video = client.get(f"/v1/videos/{video_id}").json()
        if video["status"] in statuses:
            return video
        time.sleep(0.02)
    raise TimeoutError(f"{video_id} never reached {statuses}; last: {video}")


class BlockingJob:
    """A job with far more steps than any test waits for: it holds the slot until deleted."""

    def __init__(self, client: httpx.Client, wait_running: bool = True, steps: int = BLOCKING_STEPS, **fields: object) -> None:
        self.client = client
        self.video = create_video(client, num_inference_steps=steps, **fields)
        self.id = self.video["id"]
        if wait_running:
            self.video = wait_for_status(client, self.id, {"in_progress"})

    def __enter__(self) -> "BlockingJob":
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.delete(f"/v1/videos/{self.id}")


@contextmanager
def open_connections(url: str, count: int, first: bytes = b"") -> Iterator[list[socket.socket]]:
    """`count` raw connections to the server at `url`, each having sent `first` (nothing: idle); closed on exit."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5))
            if first:
                socks[-1].sendall(first)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def held_open(sock: socket.socket) -> bool:
    """True while the server keeps `sock` open: a read that times out or gets a byte; False once it closed or reset."""
    sock.settimeout(0.05)
    try:
        return sock.recv(1) != b""
    except socket.timeout:
        return True
    except OSError:
        return False


def parse_sse(lines: list[str]) -> list[tuple[str, dict]]:
    """SSE frames -> (event, data) pairs; comments (keepalives) are skipped."""
    import json

    events, name, data = [], None, None
    for line in lines:
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            data = json.loads(line.split(":", 1)[1])
        elif line == "" and name is not None:
            events.append((name, data))
            name, data = None, None
    return events


def events_then_live_stream(client: httpx.Client, video_id: str) -> tuple[list[tuple[str, dict]], int]:
    """A chunked video job's SSE events (read to the end), then, once it completed, how many frames its live
    fragmented-MP4 variant (the stream the chunks grew) decodes to."""
    import io

    import av

    with client.stream("GET", f"/v1/videos/{video_id}/events") as response:
        events = parse_sse(list(response.iter_lines()))
    assert wait_for_status(client, video_id, {"completed"})["status"] == "completed"
    stream = client.get(f"/v1/videos/{video_id}/content", params={"variant": "stream"})
    assert stream.status_code == 200, stream.text
    with av.open(io.BytesIO(stream.content)) as container:
        return events, sum(1 for _ in container.decode(video=0))
