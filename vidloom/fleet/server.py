"""FleetServer: the fleet's ingress on our own uvicorn, with the single server's protocol, caps and health port."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Mapping

import uvicorn

from vidloom.fleet.ingress import FleetJobs, create_fleet_app
from vidloom.serving.config import ServeConfig
from vidloom.serving.server import BindError, bind, bind_health, uvicorn_config


class FleetServer:
    """Binds the card's address (and health_port) first, so a taken port fails before Ray starts;
    `start(replicas)` serves the ingress over those replica handles in a background thread."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.sock = bind(config.host, config.port)
        try:
            self.health_sock = bind_health(config)
        except BindError:
            self.sock.close()
            raise
        self.url = _url(self.sock)
        self.health_url = None if self.health_sock is None else _url(self.health_sock)
        self.jobs: FleetJobs | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, replicas: Mapping[str, Any], log_level: str = "info", timeout_s: float = 30.0) -> None:
        from vidloom.serving.job_backends import open_job_store

        # Reads and flags only: recovery is the replicas' job (they know who is alive).
        self.jobs = FleetJobs(open_job_store(self.config.store, self.config.data_dir), self.config, replicas)
        app = create_fleet_app(self.config, self.jobs)
        self._server = uvicorn.Server(uvicorn_config(app, self.config, log_level, self.health_sock))
        sockets = [s for s in (self.sock, self.health_sock) if s is not None]
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": sockets},
                                        name="vidloom-fleet-ingress", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fleet's ingress did not start")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout_s)
        for sock in (self.sock, self.health_sock):
            if sock is not None:
                sock.close()
        if self.jobs is not None:
            self.jobs.store.close()


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
