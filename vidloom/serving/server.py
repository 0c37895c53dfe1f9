"""`vidloom serve`: load the model, bind the socket, run uvicorn."""

from __future__ import annotations

import logging
import socket
from typing import Awaitable, Callable

import uvicorn

from vidloom.serving.config import ServeConfig
from vidloom.serving.http_protocol import with_header_timeout

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts, so port 0 works and the real port can be printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class BindError(OSError):
    """The address is taken, not ours, or not resolvable; the message says which address."""


class GracefulServer(uvicorn.Server):
    """uvicorn, with one step added to its shutdown: after the listeners close, `drain` ends the jobs.

    uvicorn alone waits for every open connection (an event stream never ends by itself), then cuts
    them; draining first makes each stream send its job's final event and close, so nothing waits.
    """

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # stop accepting first (uvicorn's own shutdown repeats this, harmlessly)
            server.close()
        for sock in sockets or []:
            sock.close()
        if not self.force_exit:  # a second Ctrl-C skips the grace period
            try:
                await self._drain()
            except Exception:
                log.exception("draining jobs at shutdown failed")
        await super().shutdown(sockets)


def uvicorn_server(app: object, config: ServeConfig, log_level: str = "info") -> uvicorn.Server:
    from vidloom.serving.app import drain

    return GracefulServer(uvicorn.Config(
        app, log_level=log_level, timeout_graceful_shutdown=config.graceful_shutdown_s,
        # One process: the model is resident once and the device worker is a thread in it.
        workers=1, lifespan="on",
        # Slow or idle clients: a deadline for each request head (h11, our protocol), the
        # keep-alive idle timeout, and a cap on connections (more get 503).
        http=with_header_timeout(config.header_timeout_s),
        timeout_keep_alive=config.keep_alive_timeout_s,  # type: ignore[arg-type]  # uvicorn takes a float
        limit_concurrency=config.max_connections,
    ), drain=lambda: drain(app))  # type: ignore[arg-type]


def serve(config: ServeConfig) -> None:
    """Blocks until SIGINT/SIGTERM, then drains (see ServeConfig.graceful_shutdown_s).

    Raises BindError or StoreError (a corrupt database, a full disk, a -wal without its database) before
    the address is printed.
    """
    from vidloom.generator import VideoGenerator
    from vidloom.serving.app import create_app
    from vidloom.serving.jobs import open_store

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sock = bind(config.host, config.port)  # first, so a taken port fails before a long model load
    try:
        store = open_store(config)  # and a bad database too
    except BaseException:
        sock.close()
        raise
    generator = VideoGenerator.from_pretrained(
        config.model, device=config.device, dtype=config.dtype, deploy=config.deploy
    )
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    _warn_if_open(config, host)
    print(f"vidloom serving {config.served_model_name or generator.card.model_id} on http://{shown}:{port} "
          f"(data in {config.data_dir.resolve()})", flush=True)
    uvicorn_server(create_app(generator.engine, config, store), config).run(sockets=[sock])


def _warn_if_open(config: ServeConfig, host: str) -> None:
    if config.api_key is None and host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("listening on %s without an API key: anyone who can reach it can use it "
                    "(set VIDLOOM_API_KEY or --api-key)", host)
