"""`vidloom serve`: load the model, bind the socket, run uvicorn."""

from __future__ import annotations

import logging
import socket

import uvicorn

from vidloom.serving.config import ServeConfig


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


def uvicorn_server(app: object, config: ServeConfig, log_level: str = "info") -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(
        app, log_level=log_level, timeout_graceful_shutdown=config.graceful_shutdown_s,
        # One process: the model is resident once and the device worker is a thread in it.
        workers=1, lifespan="on",
    ))


def serve(config: ServeConfig) -> None:
    """Blocks until SIGINT/SIGTERM; unfinished jobs then end failed (server_restart)."""
    from vidloom.generator import VideoGenerator
    from vidloom.serving.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sock = bind(config.host, config.port)  # first, so a taken port fails before a long model load
    generator = VideoGenerator.from_pretrained(
        config.model, device=config.device, dtype=config.dtype, deploy=config.deploy
    )
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"vidloom serving {config.served_model_name or generator.card.model_id} on http://{shown}:{port} "
          f"(data in {config.data_dir.resolve()})", flush=True)
    uvicorn_server(create_app(generator.engine, config), config).run(sockets=[sock])
