"""Abusive clients for bench/serve_load.py --abuse: they run alongside normal jobs until stopped.

Six kinds, each in its own thread, each counting what the server answered:
- oversized: requests over a work limit or malformed (2048x2048, a million steps, deep JSON,
  a lone surrogate); each must be a quick 4xx.
- disconnecting: image requests that hang up after 0.3 s (the render must be cancelled) and
  event streams dropped after the first event.
- slow readers: event streams of the normal jobs, read one line every second.
- slowloris: raw sockets sending one header line every second (the server must drop them).
- upload bombs: small files claiming huge media (a PNG header of 100000x100000, a 13000x13000 PNG,
  H.264 of 77 frames at 2048x2048 (16 KB) and at 4096x4096 (53 KB)); refused from their headers, or
  (the 2048 video, a valid video-to-video input) queued holding only the file: up to 4 are kept
  queued, then deleted, so queued bombs are part of the server's memory while the load runs; the
  last 4 run to the end when the abuse stops (the device worker decodes them frame by frame).
- idle connections: sockets that connect and send nothing, and keep-alive connections left idle
  after one request, 16 of each at a time (the server must close them on its timeouts).
The newer surfaces (speech, spoken chat with media, sessions over WebSocket, LoRA admin) have their own
mixes and RSS budget in bench/serve_abuse_surfaces.py (other models than the video server's).
"""

from __future__ import annotations

import multiprocessing
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from bench/: the bomb builders live with the tests
    sys.path.insert(0, str(ROOT))

OVERSIZED = (
    ("json", {"prompt": "x", "size": "2048x2048", "num_frames": 1, "num_inference_steps": 1, "guidance_scale": 1}),
    ("json", {"prompt": "x", "size": "64x48", "num_inference_steps": 1_000_000}),
    ("json", {"prompt": "x", "size": "64x48", "num_frames": 1025}),
    ("raw", "[" * 100_000),
    ("raw", '{"prompt": "\\ud800"}'),
)
HELD_BOMB_JOBS = 4  # accepted upload-bomb jobs kept queued at once
IDLE_SOCKETS = 16  # of each idle kind
UPLOAD_FORM = {"prompt": "x", "size": "64x48", "num_inference_steps": "2", "seed": "0"}  # strength 0.5: 1 step


class AbuseMix:
    """Start with `with AbuseMix(url) as mix:`; `mix.counts` holds outcomes by kind and status."""

    def __init__(self, url: str, long_steps: int) -> None:
        self.url = url
        self.long_steps = long_steps
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._bombs = _upload_bombs()
        self._held: list[str] = []  # accepted bomb jobs, oldest first
        works = (self._oversized, self._disconnecting, self._slow_reader, self._slowloris, self._upload_bomb,
                 self._idle_connections)
        self._threads = [threading.Thread(target=self._guard(work), daemon=True) for work in works]

    def __enter__(self) -> "AbuseMix":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        self._finish_held()

    def _finish_held(self, timeout_s: float = 180.0) -> None:
        """Let the last queued bomb jobs run (the device worker decodes their files), then delete them."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=10) as http:
            for job_id in self._held:
                status = "queued"
                while status in ("queued", "in_progress") and time.monotonic() < deadline:
                    time.sleep(0.2)
                    status = http.get(f"/v1/videos/{job_id}").json()["status"]
                self._count(f"upload_bomb:ran_{status}")
                http.delete(f"/v1/videos/{job_id}")

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def _guard(self, work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            while not self._stop.is_set():
                try:
                    work()
                except (httpx.HTTPError, OSError) as exc:
                    self._count(f"{work.__name__}:{type(exc).__name__}")
                    time.sleep(0.1)
        return run

    def _oversized(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            for kind, body in OVERSIZED:
                if kind == "json":
                    response = http.post("/v1/videos", json=body)
                else:
                    response = http.post("/v1/videos", content=body, headers={"content-type": "application/json"})
                self._count(f"oversized:{response.status_code}")
                time.sleep(0.05)

    def _disconnecting(self) -> None:
        with httpx.Client(base_url=self.url, timeout=0.3) as http:
            try:
                http.post("/v1/images/generations", json={"prompt": "x", "size": "64x48",
                                                          "num_inference_steps": self.long_steps})
                self._count("disconnect:finished")
            except httpx.ReadTimeout:
                self._count("disconnect:hung_up")
        time.sleep(0.5)

    def _slow_reader(self) -> None:
        """Follow a normal job's event stream (no extra work) but read one line a second."""
        with httpx.Client(base_url=self.url, timeout=60) as http:
            videos = http.get("/v1/videos", params={"limit": 10}).json()["data"]
            active = [v["id"] for v in videos if v["status"] in ("queued", "in_progress")]
            if not active:
                time.sleep(0.2)
                return
            with http.stream("GET", f"/v1/videos/{active[0]}/events") as stream:
                self._count("slow_reader:followed")
                for line in stream.iter_lines():
                    if line.startswith("event:") and "progress" not in line:
                        self._count(f"slow_reader:{line.split(':', 1)[1].strip()}")
                        return
                    if self._stop.wait(1.0):
                        return

    def _slowloris(self) -> None:
        address = urlparse(self.url)
        with socket.create_connection((address.hostname, address.port), timeout=5) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            started = time.monotonic()
            while not self._stop.is_set():
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                    sock.settimeout(1.0)
                    if sock.recv(1024) == b"":
                        break
                except socket.timeout:
                    continue
                except OSError:
                    break
            self._count(f"slowloris:held_{round(time.monotonic() - started)}s")


    def _upload_bomb(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            for name, field, data, form in self._bombs:
                response = http.post("/v1/videos", data={**UPLOAD_FORM, **form}, files={field: (name, data)})
                self._count(f"upload_bomb:{name}:{response.status_code}")
                if response.status_code == 200:
                    self._held.append(response.json()["id"])
                while len(self._held) > HELD_BOMB_JOBS:  # how far it got (a running one decodes its file)
                    job_id = self._held.pop(0)
                    self._count(f"upload_bomb:job_{http.get(f'/v1/videos/{job_id}').json()['status']}")
                    http.delete(f"/v1/videos/{job_id}")
                if self._stop.wait(0.1):
                    return

    def _idle_connections(self) -> None:
        """Sockets that send nothing, and keep-alive sockets idle after one request: how long the server keeps them."""
        address = urlparse(self.url)
        sockets: list[tuple[str, socket.socket, float]] = []
        try:
            for kind in ("silent", "keepalive"):
                for _ in range(IDLE_SOCKETS):
                    sock = socket.create_connection((address.hostname, address.port), timeout=5)
                    if kind == "keepalive":
                        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                        sock.recv(65536)  # the answer (small): the connection stays open, idle
                    sockets.append((kind, sock, time.monotonic()))
            open_ = list(sockets)
            while open_ and not self._stop.wait(0.5):
                for entry in list(open_):
                    kind, sock, started = entry
                    sock.settimeout(0.01)
                    try:
                        closed = sock.recv(1024) == b""
                    except socket.timeout:
                        closed = False
                    except OSError:
                        closed = True
                    if closed:
                        self._count(f"idle_{kind}:closed_after_{round(time.monotonic() - started)}s")
                        open_.remove(entry)
            for kind, _, _ in open_:
                self._count(f"idle_{kind}:still_open")
        finally:
            for _, sock, _ in sockets:
                sock.close()


def _upload_bombs() -> list[tuple[str, str, bytes, dict[str, str]]]:
    """(name, form field, file, extra form fields) of each upload bomb."""
    from tests.helpers.upload_bombs import png_claiming, uniform_h264

    v2v = {"strength": "0.5"}
    return [
        ("png_100000px", "input_reference", png_claiming(100_000, 100_000), {}),
        ("png_13000px", "input_reference", png_claiming(13_000, 13_000), {}),
        ("h264_77x2048px", "video", uniform_h264(2048, 2048, 77), v2v),
        ("h264_77x4096px", "video", uniform_h264(4096, 4096, 77), v2v),
    ]


class AbuseProcess:
    """AbuseMix in its own process, so the abusers' Python work does not slow the measuring client.

    Entering waits until the abusers run (building the bomb files takes seconds); leaving keeps them
    running until `min_s` have passed, long enough for the server's connection timeouts to act.
    """

    def __init__(self, url: str, long_steps: int, min_s: float = 15.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._ready = ctx.Event()
        self._results = ctx.Queue()
        self._proc = ctx.Process(target=_run_abuse, args=(url, long_steps, self._ready, self._stop, self._results),
                                 daemon=True)
        self.min_s = min_s
        self.counts: dict[str, int] = {}

    def __enter__(self) -> "AbuseProcess":
        self._proc.start()
        if not self._ready.wait(120):
            raise RuntimeError("the abusive clients did not start")
        self._started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(max(0.0, self.min_s - (time.monotonic() - self._started)))
        self._stop.set()
        self.counts = self._results.get(timeout=300)  # the last bomb jobs run to the end first
        self._proc.join(30)


def _run_abuse(url: str, long_steps: int, ready: "multiprocessing.synchronize.Event",
               stop: "multiprocessing.synchronize.Event", results: "multiprocessing.Queue") -> None:
    with AbuseMix(url, long_steps) as mix:
        ready.set()
        stop.wait()
    results.put(dict(mix.counts))
